"""Bad input through the real Envoy: each case has a defined outcome and never a lost or hung request."""

from __future__ import annotations

import json
import os
import socket

import httpx
import pytest

from tests.support.stack import BUFFERED, metric, scrape

URL = "/v1/chat/completions"


def post(stack, content: bytes, path=URL, timeout=30):
    return httpx.post(f"{stack.url}{path}", content=content, timeout=timeout,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    "content, reason, kind",
    [
        (b"[1, 2, 3]", "invalid_body", "not_object"),
        (b'"a string"', "invalid_body", "not_object"),
        (os.urandom(2048).replace(b"{", b"(").replace(b"\x00", b"-") + b"\xff", "refused", "not_utf8"),
        (b"\xff\xfe" + "héllo".encode("latin-1"), "refused", "not_utf8"),
        (b"not json at all", "invalid_body", "not_json"),
        (b'{"model": "auto"}', "no_prompt", None),
        (b'{"model": "auto", "messages": []}', "no_prompt", None),
        (b'{"model": "auto", "messages": [{"role": "user", "content": 42}]}', "no_prompt", None),
        (b'{"model": ["auto"], "messages": []}', "invalid_body", "bad_model"),
    ],
)
def test_unusable_bodies_get_the_default_route(stack, content, reason, kind):
    """Or, where a backend could read them otherwise (other charsets), a 400."""
    before = scrape(stack.metrics_url)
    r = post(stack, content)
    if reason == "refused":
        assert r.status_code == 400 and r.json()["error"]["code"] == kind and "x-mock-backend" not in r.headers
        after = scrape(stack.metrics_url)
        assert metric(after, "semantic_router_bad_requests_total", f'kind="{kind}"') == metric(
            before, "semantic_router_bad_requests_total", f'kind="{kind}"') + 1
        return
    assert r.status_code == 200
    assert r.headers["x-mock-backend"] == "general-model"
    assert r.headers["x-semantic-route-reason"] == reason
    if reason == "invalid_body":
        assert r.json()["mock"]["body_bytes"] == len(content)  # passed through untouched
    else:
        assert r.json()["model"] == "general-model"  # "auto" still becomes a real model
    after = scrape(stack.metrics_url)
    assert metric(after, "semantic_router_requests_total", f'outcome="{reason}"') > metric(
        before, "semantic_router_requests_total", f'outcome="{reason}"')
    if kind:
        assert metric(after, "semantic_router_bad_requests_total", f'kind="{kind}"') == metric(
            before, "semantic_router_bad_requests_total", f'kind="{kind}"') + 1


def test_huge_prompt_is_truncated_and_still_routed(stack):
    body = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "solve 3x + 5 = 20 " * 20000}]})
    r = post(stack, body.encode())
    assert r.status_code == 200
    assert (r.headers["x-semantic-route"], r.headers["x-semantic-route-reason"]) == ("math", "matched")
    assert r.json()["model"] == "math-model"


def test_body_above_router_limit_goes_to_default_unparsed(stack):
    body = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]})
    r = post(stack, body.encode())
    assert r.status_code == 200
    assert r.headers["x-semantic-route-reason"] == "body_too_large"
    assert r.headers["x-mock-backend"] == "general-model"


def test_body_above_envoy_buffer_gets_413(stack):
    """Refused at its content-length by the router, before the upload, in every body mode, or,
    buffered, by Envoy's own buffer where that filled first (tests/integration/test_edge_uploads_over_buffer.py)."""
    r = post(stack, b'{"model":"auto","messages":[{"role":"user","content":"' + b"x" * (9 * 1024 * 1024) + b'"}]}')
    assert r.status_code == 413
    if r.text.startswith("{"):
        assert r.json()["error"]["code"] == "request_too_large"
    else:
        assert r.text == "Payload Too Large" and BUFFERED, "only where Envoy buffers from the start may it refuse first"


def test_other_methods_are_not_processed_and_other_paths_never_reach_a_backend(stack):
    before = metric(scrape(stack.metrics_url), "semantic_router_requests_total", 'outcome="not_processed"')
    r = httpx.get(f"{stack.url}{URL}")  # an LLM path, but no call to route
    assert r.status_code == 200 and r.headers["x-mock-backend"] == "general-model"
    assert "x-semantic-route" not in r.headers
    after = metric(scrape(stack.metrics_url), "semantic_router_requests_total", 'outcome="not_processed"')
    assert after >= before + 1
    for r in (httpx.get(f"{stack.url}/v1/models"), post(stack, b'{"anything": true}', path="/admin/stats")):
        assert r.status_code == 404 and "x-mock-backend" not in r.headers  # Envoy's own answer


def test_client_disconnect_mid_request_leaves_the_gateway_healthy(stack):
    host, port = stack.url.removeprefix("http://").split(":")
    for _ in range(5):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(f"POST {URL} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: 10000\r\n\r\n".encode() + b'{"model": "auto", "mess')
        # Closed with most of the body unsent.
    r = post(stack, json.dumps({"model": "auto", "messages": [{"role": "user", "content": "compute 7 * 8"}]}).encode())
    assert r.status_code == 200 and r.headers["x-semantic-route"] == "math"
