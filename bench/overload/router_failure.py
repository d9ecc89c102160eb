"""What a client sees when the router is away, in each body mode: killed before the request, killed
mid-body, and stalled (SIGSTOP) mid-body.

    python -m bench.overload.router_failure [--out build/bench-router-failure.json]

One stack per mode (router.yaml, mock backends, Envoy rendered for the mode: buffered and streamed
(where the router asks for an LLM call's body whole) fail open,
full duplex cannot). Each case sends a chat completion whose body arrives in chunks 100 ms apart
(so the failure can land mid-body), and records the status, whether a backend answered, whether
the router routed it, and how long the client waited.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.report import emit
from devstack.stack import stack_with

BODY = (b'{"model":"auto","messages":[{"role":"user","content":"solve the equation 2x + 3 = 11 ', b'please',
        b' and show the steps"}]}')


def send(url: str, gap_s: float, on_second_chunk=None) -> dict:
    def chunks():
        for i, part in enumerate(BODY):
            if i == 1 and on_second_chunk is not None:
                on_second_chunk()
            time.sleep(gap_s)
            yield part

    t0 = time.monotonic()
    try:
        # Past the rendered request_timeout (60 s): what ends a wait on a stalled router in full duplex.
        r = httpx.post(f"{url}/v1/chat/completions", content=chunks(), timeout=90,
                       headers={"content-type": "application/json"})
        return {"status": r.status_code, "backend": r.headers.get("x-mock-backend", "-"),
                "routed": r.headers.get("x-semantic-route-reason", "-"), "waited_ms": round((time.monotonic() - t0) * 1000)}
    except httpx.HTTPError as exc:
        return {"status": type(exc).__name__, "backend": "-", "routed": "-",
                "waited_ms": round((time.monotonic() - t0) * 1000)}


def cases(stack) -> list[tuple[str, dict]]:
    out = [("router up", send(stack.url, 0.1))]
    stack.kill_router(signal.SIGKILL)
    out.append(("router killed before the request", send(stack.url, 0.1)))
    stack.start_router()
    out.append(("router killed mid-body", send(stack.url, 0.1, lambda: stack.kill_router(signal.SIGKILL))))
    stack.start_router()
    stalled = threading.Event()

    def stall():
        stack.router.send_signal(signal.SIGSTOP)
        stalled.set()

    out.append(("router stalled (SIGSTOP) mid-body", send(stack.url, 0.1, stall)))
    stack.router.send_signal(signal.SIGCONT)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.overload.router_failure")
    p.add_argument("--out", default=None)
    p.add_argument("--modes", nargs="+", default=["buffered", "streamed", "full_duplex_streamed"])
    args = p.parse_args()
    rows = []
    for mode in args.modes:
        def change(config, mode=mode):
            config.setdefault("envoy", {})["request_body_mode"] = mode

        with stack_with(Path(tempfile.mkdtemp(prefix=f"bench-failure-{mode}-")), change) as stack:
            for case, seen in cases(stack):
                rows.append({"workload": mode, "scenario": case, **seen})
    emit({"rows": rows}, args.out, columns=("workload", "scenario", "status", "backend", "routed", "waited_ms"))


if __name__ == "__main__":
    main()
