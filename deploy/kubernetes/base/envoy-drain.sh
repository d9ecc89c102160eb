#!/bin/bash
# Envoy's preStop hook: drain before Kubernetes sends SIGTERM. SIGTERM alone ends Envoy at once and
# resets every request in flight, a streamed completion included; Envoy drains only when its admin
# asks it to. The stock Envoy image has no curl, so the admin is reached through bash's /dev/tcp.
#
#   envoy-drain.sh [ADMIN_HOST:PORT] [MAX_WAIT_S] [SETTLE_S]
#
# 1. /healthcheck/fail: GET /healthz answers 503, so readiness takes the pod out of the Service;
# 2. SETTLE_S seconds of normal serving while endpoints and load balancers drop the pod;
# 3. /drain_listeners?graceful&skip_exit: every response from now on tells its client to close
#    (Connection: close, HTTP/2 GOAWAY; run Envoy with --drain-strategy immediate);
# 4. wait until no request is active on the LLM listener, at most MAX_WAIT_S (keep it below the
#    pod's terminationGracePeriodSeconds); then return, and SIGTERM finds nothing left to cut.
# An unreachable admin ends the hook at once: it never holds a pod that cannot drain anyway.
set -u
admin=${1:-127.0.0.1:9901}
max_wait=${2:-100}
settle=${3:-5}
host=${admin%:*}
port=${admin##*:}

admin_call() {  # METHOD PATH: prints the answer's body; fails unless Envoy answered 200
    local reply
    exec 3<>"/dev/tcp/$host/$port" || return 1
    printf '%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n' "$1" "$2" "$host" >&3
    reply=$(cat <&3)
    exec 3<&-
    [[ $reply == HTTP/1.1\ 200* ]] || return 1
    printf '%s\n' "${reply#*$'\r\n\r\n'}"
}

admin_call POST /healthcheck/fail >/dev/null || exit 0
sleep "$settle"
admin_call POST '/drain_listeners?graceful&skip_exit' >/dev/null || exit 0
deadline=$((SECONDS + max_wait))
while ((SECONDS < deadline)); do
    stats=$(admin_call GET '/stats?filter=llm_gateway.downstream_rq_active') || exit 0
    [[ $stats =~ downstream_rq_active:\ ([0-9]+) ]] && ((BASH_REMATCH[1] == 0)) && exit 0
    sleep 0.5
done
exit 0
