"""No LLM call reaches a backend as if the router had decided it: the router marks what it decides,
and the rendered Envoy config takes every other call by `envoy.undecided` (the default route, or a
503 where a blocking guard is configured), whatever left it undecided. Through the real Envoy, in
each body mode (make test runs this module in all three)."""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.parse
import uuid

import httpx
import pytest

from devstack.stack import stack_with
from tests.support import h2client
from tests.support.stack import BUFFERED, DUPLEX, GUARDED, metric, scrape
from tests.support.waiting import wait_for

CHAT = "/v1/chat/completions"
MATH = {"model": "auto", "messages": [{"role": "user", "content": "solve the equation 5x + 2 = 17"}]}
INJECTION = {"model": "auto", "messages": [{"role": "user", "content": GUARDED}]}


def h2_post(stack, body: dict, **kwargs) -> h2client.Reply:
    url = urllib.parse.urlsplit(stack.url)
    return h2client.post(url.hostname, url.port, CHAT, json.dumps(body).encode(), **kwargs)


def post(stack, body: dict, key: str) -> httpx.Response:
    return httpx.post(f"{stack.url}{CHAT}", json=body, headers={"x-mock-key": key}, timeout=15)


def envoy_stat(stack, name: str) -> int:
    admin = f"http://127.0.0.1:{stack.ports.admin}/stats?filter={name}"
    for line in httpx.get(admin, timeout=5).text.splitlines():
        stat, _, value = line.partition(": ")
        if stat == name:
            return int(value)
    return 0


STREAMED = not BUFFERED and not DUPLEX


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "no-length"])
@pytest.mark.parametrize("pieces", [1, 4])
def test_a_body_ended_by_trailers_is_routed_like_any_other(stack, pieces, declared):
    """HTTP/2 with trailers: Envoy hands the router the body without end_of_stream. It once went on
    to the default backend unrouted, unguarded and unrecorded (and in full duplex hung)."""
    key = uuid.uuid4().hex
    raw = json.dumps(MATH).encode()
    headers = {"x-mock-key": key, **({"content-length": str(len(raw))} if declared else {})}
    r = h2_post(stack, MATH, headers=headers, trailers={"x-checksum": "0"}, pieces=pieces, pause_s=0.05)
    assert r.status == 200, r
    if STREAMED and not declared:
        # Asked for whole, the body comes before its trailers without end_of_stream, and with no
        # declared length the router cannot tell it from a part: undecided, by the policy (default here).
        assert r.headers["x-mock-backend"] == "general-model" and "x-semantic-route" not in r.headers
        return
    assert r.headers["x-mock-backend"] == "math-model" and r.headers["x-semantic-route-reason"] == "matched"
    assert json.loads(r.body)["model"] == "math-model"  # the body the router rewrote


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "no-length"])
def test_a_body_ended_by_trailers_meets_the_guard(guarded_stack, declared):
    key = uuid.uuid4().hex
    raw = json.dumps(INJECTION).encode()
    headers = {"x-mock-key": key, **({"content-length": str(len(raw))} if declared else {})}
    r = h2_post(guarded_stack, INJECTION, headers=headers, trailers={"x-checksum": "0"})
    if STREAMED and not declared:  # undecided, as above; a blocking guard makes the policy refuse
        assert r.status == 503 and b"router_unavailable" in r.body
    else:
        assert r.status == 403 and b"content_policy_violation" in r.body
    assert key not in guarded_stack.backends.attempts


@pytest.fixture(scope="module")
def refusing_stack(tmp_path_factory, envoy_binary):
    """A blocking guard, so envoy.undecided (auto) refuses; two calls decided at once."""
    def guard(config):
        config["filters"] = ["prompt_guard", "model_policy", "semantic_route"]
        config["filter_settings"] = {"prompt_guard": {"exemplars": [GUARDED], "threshold": 0.9, "on_error": "block"}}
        config["server"]["max_in_flight"] = 2

    with stack_with(tmp_path_factory.mktemp("refusing"), guard) as s:
        yield s


def stalled_upload(stack, declared: int = 100_000) -> socket.socket:
    """An upload that sends its headers and a first part of its body, then nothing more."""
    url = urllib.parse.urlsplit(stack.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=5)
    head = (f"POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {declared}\r\n\r\n").encode()
    sock.sendall(head + b'{"model": "auto", "messages": [{"role": "user", "content": "')
    return sock


def test_stalled_uploads_take_no_slot_and_every_request_still_meets_the_guard(refusing_stack):
    """Enough stalled uploads once filled the router's slots: every request after them was shed at
    its headers to the default backend, the injection included."""
    stalled = [stalled_upload(refusing_stack) for _ in range(8)]  # four times max_in_flight
    try:
        time.sleep(0.5)  # their headers have reached the router
        for i in range(6):
            key = uuid.uuid4().hex
            r = post(refusing_stack, {**MATH, "messages": [{"role": "user", "content": f"solve {i}x + 2 = 17"}]}, key)
            assert r.status_code == 200 and r.headers["x-semantic-route-reason"] == "matched", r.headers
            assert refusing_stack.backends.attempts[key] == 1
        key = uuid.uuid4().hex
        assert post(refusing_stack, INJECTION, key).status_code == 403 and key not in refusing_stack.backends.attempts
    finally:
        for sock in stalled:
            sock.close()
    assert metric(scrape(refusing_stack.metrics_url), "semantic_router_shed_at_headers_total") == 0


def test_another_method_on_an_llm_path_takes_the_policy_counted(refusing_stack):
    """Not an LLM call (the router skips its body), yet on a path Envoy's LLM routes match: never a
    way to a backend past the guard, counted by why."""
    key = uuid.uuid4().hex
    r = httpx.request("GET", f"{refusing_stack.url}{CHAT}", content=json.dumps(INJECTION), timeout=15,
                      headers={"x-mock-key": key, "content-type": "application/json"})
    assert r.status_code == 503 and key not in refusing_stack.backends.attempts
    wait_for(lambda: metric(scrape(refusing_stack.metrics_url), "semantic_router_undecided_total",
                            'outcome="refused",why="not_processed"') >= 1, 10, "the GET counted as undecided")


def test_with_the_router_dead_no_call_reaches_a_backend_unguarded(refusing_stack):
    before = envoy_stat(refusing_stack, "http.llm_gateway.downstream_rq_5xx")
    refusing_stack.kill_router(signal.SIGKILL)
    try:
        for body in (INJECTION, MATH, {**MATH, "model": "code-model"}):  # a pinned model too: the guard reads it
            key = uuid.uuid4().hex
            r = post(refusing_stack, body, key)
            # Full duplex fails closed in Envoy itself (its 500); the others meet the undecided policy's 503.
            assert r.status_code == (500 if DUPLEX else 503), (r.status_code, r.text)
            assert key not in refusing_stack.backends.attempts
            if not DUPLEX:
                assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "router_unavailable"
        # Trailers, the router dead: the same.
        key = uuid.uuid4().hex
        assert h2_post(refusing_stack, MATH, headers={"x-mock-key": key}, trailers={"x-c": "0"}).status >= 500
        assert key not in refusing_stack.backends.attempts
        assert envoy_stat(refusing_stack, "http.llm_gateway.downstream_rq_5xx") >= before + 4
        if not DUPLEX:
            wait_for(lambda: "semantic_router_undecided" in refusing_stack.log_tail("envoy", 50), 10,
                     "Envoy's log line for each undecided call")
    finally:
        refusing_stack.start_router()
    key = uuid.uuid4().hex
    r = post(refusing_stack, MATH, key)
    assert r.status_code == 200 and r.headers["x-semantic-route-reason"] == "matched"


def test_a_shed_call_takes_the_default_route_counted_by_why(tmp_path_factory, envoy_binary):
    """Where nothing blocks (envoy.undecided: default), a call the router sheds goes on to the
    default backend, and the router counts it by why from Envoy's own report. The router sheds in
    buffered body mode only (Envoy reads the pinned model there); in the others it decides."""
    def shed_everything(config):
        config["server"]["shed_wait_ms"] = 0.001  # every call waits longer than a microsecond to be read
        config.setdefault("envoy", {})["undecided"] = "default"

    with stack_with(tmp_path_factory.mktemp("shedding"), shed_everything) as s:
        key = uuid.uuid4().hex
        r = post(s, MATH, key)
        if not BUFFERED:
            assert r.status_code == 200 and r.headers["x-semantic-route-reason"] == "matched"
            return
        assert r.status_code == 200 and r.headers["x-mock-backend"] == "general-model"
        assert r.headers["x-semantic-route-reason"] == "fallback_overload"
        wait_for(lambda: metric(scrape(s.metrics_url), "semantic_router_undecided_total",
                                'outcome="default_route",why="fallback_overload"') >= 1, 10, "the undecided call counted")
        assert envoy_stat(s, "vhost.llm.route.semantic_router_undecided.upstream_rq_total") >= 1
