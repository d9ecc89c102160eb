"""No spelling of an LLM path that a backend would serve as an LLM call skips the filter chain.

The mock backends decode percent-escapes (as Starlette-based servers such as vLLM do); the stack
here runs a 1 MiB body limit, a blocking prompt guard and `unknown_model: reject`, so a bypass would
show as a 200."""

from __future__ import annotations

import httpx
import pytest

from tests.support.stack import GUARDED

SPELLINGS = [
    "/v1/chat/completions", "/v1/chat/%63ompletions", "/v1/%63hat/completions?a=b", "/v1/chat/completions/",
    "/v1/chat/completions;x=1", "/v1/chat/completions%3Bx", "/V1/Chat/Completions", "//v1//chat/completions",
    "/v1/chat%2Fcompletions", "/v1/x/../chat/completions", "/v1/chat/%2e/completions", "/v1/%6Dessages",
]


def send(stack, path: str, body: bytes) -> httpx.Response:
    with httpx.Client(timeout=30) as client:
        request = client.build_request("POST", stack.url, content=body, headers={"content-type": "application/json"})
        request.url = request.url.copy_with(raw_path=path.encode())  # exactly as spelled (curl --path-as-is)
        return client.send(request)


@pytest.mark.parametrize("path", SPELLINGS)
def test_every_spelling_goes_through_the_guard_and_the_model_policy(guarded_stack, path):
    guarded = send(guarded_stack, path, b'{"model":"auto","messages":[{"role":"user","content":"%s"}]}' % GUARDED.encode())
    assert guarded.status_code == 403 and "x-mock-backend" not in guarded.headers, guarded.text[:200]
    unknown = send(guarded_stack, path, b'{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}')
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("mib", [2, 5])
def test_body_limit_holds_also_above_the_routers_parsing_limit(guarded_stack, mib):
    """5 MiB is above requests.max_body_bytes (4 MiB): such a body is not parsed, but it still
    passes the filter chain (it used to skip it and reach the backend)."""
    pad = b"x" * (mib * 1024 * 1024)
    body = b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"pad":"%s"}' % pad
    r = send(guarded_stack, "/v1/chat/completions", body)
    assert r.status_code == 413 and "x-mock-backend" not in r.headers, r.text[:200]
    assert r.json()["error"]["code"] == "request_too_large"
