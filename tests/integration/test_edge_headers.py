"""Many request headers: a clear 431, never a 500 from the router's own headers overflowing Envoy's limit."""

from __future__ import annotations

import httpx
import pytest

BODY = b'{"model":"auto","messages":[{"role":"user","content":"solve 2x + 3 = 7"}]}'


@pytest.mark.parametrize("count", [60, 75, 85, 90, 93, 95, 97, 99, 100, 120])
def test_no_header_count_turns_into_a_500(stack, count):
    headers = {f"x-extra-{i}": "v" for i in range(count)}
    headers["content-type"] = "application/json"
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=BODY, headers=headers, timeout=30)
    assert r.status_code in (200, 431), (count, r.status_code, r.text[:200])
    if r.status_code == 200:
        assert r.headers["x-semantic-route-reason"] == "matched"
    if count <= 75:  # plus ~12 of httpx's and Envoy's own, well inside the limit
        assert r.status_code == 200
