"""What the backend receives, through the real Envoy: the client's bytes, with only the `model`
value replaced when the router rewrites it; ambiguous or unreadable bodies get a defined outcome."""

from __future__ import annotations

import hashlib

import httpx

from tests.support.stack import assert_framed, metric, scrape

URL = "/v1/chat/completions"


def post(stack, content: bytes, headers=None):
    return httpx.post(f"{stack.url}{URL}", content=content, timeout=30,
                      headers={"content-type": "application/json", **(headers or {})})


def sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def test_backend_gets_the_clients_bytes_with_only_the_model_spliced_in(stack):
    raw = (b'{ "model" : "auto", "messages": [{"role": "user", "content": "solve the equation 2x + 3 = 7"}],\n'
           b'  "temperature": 1E0, "seed": 12345678901234567890123, "logit_bias": {"50256": -1e2},'
           b' "top_p": 0.1000000000000000055511151231257827, "user": "\\ud800 caf\\u00e9 \\/"}')
    r = post(stack, raw)
    assert r.status_code == 200 and r.headers["x-semantic-route-reason"] == "matched"
    sent = raw.replace(b'"auto"', b'"math-model"', 1)
    assert r.json()["mock"]["body_sha256"] == sha(sent)  # a lone surrogate, exponents, long decimals: as sent
    assert_framed(r.json()["mock"]["headers"], len(sent))


def test_a_body_too_large_to_read_still_reaches_a_backend_model_it_serves(stack):
    filler = b"x" * (4 * 1024 * 1024 + 100)
    raw = b'{"model":"auto","messages":[{"role":"user","content":"' + filler + b'"}]}'
    r = post(stack, raw)
    assert r.status_code == 200 and r.headers["x-semantic-route-reason"] == "body_too_large"
    assert r.headers["x-mock-backend"] == "general-model"
    assert r.json()["mock"]["body_sha256"] == sha(raw.replace(b'"auto"', b'"general-model"', 1))


def test_repeated_keys_are_refused_by_the_gateway(stack):
    before = scrape(stack.metrics_url)
    raw = b'{"model":"code-model","messages":[{"role":"user","content":"hi"}],"model":"auto"}'
    r = post(stack, raw)
    assert r.status_code == 400 and "x-mock-backend" not in r.headers
    assert r.json()["error"]["code"] == "duplicate_key"
    after = scrape(stack.metrics_url)
    assert metric(after, "semantic_router_bad_requests_total", 'kind="duplicate_key"') > \
        metric(before, "semantic_router_bad_requests_total", 'kind="duplicate_key"')


def test_unreadable_charsets_are_refused_and_empty_bodies_routed(stack):
    body = b'{"model":"auto","messages":[{"role":"user","content":"solve 2x + 3 = 7"}]}'
    before = scrape(stack.metrics_url)
    # A Python backend's json.loads reads UTF-16: refused, not passed on unexamined.
    r = post(stack, body.decode().encode("utf-16"))
    assert r.status_code == 400 and r.json()["error"]["code"] == "not_utf8" and "x-mock-backend" not in r.headers
    cases = [  # (sent, headers, metric kind, what the backend reads)
        (b"", {}, "empty", b""),
    ]
    for raw, headers, kind, received in cases:
        r = post(stack, raw, headers)
        assert r.status_code == 200, kind
        assert r.headers["x-mock-backend"] == "general-model", kind
        assert r.headers["x-semantic-route-reason"] == "invalid_body", kind
        assert r.json()["mock"]["body_sha256"] == sha(received), kind  # passed on untouched
    after = scrape(stack.metrics_url)
    for _, _, kind, _ in [*cases, (None, None, "not_utf8", None)]:
        label = f'kind="{kind}"'
        assert metric(after, "semantic_router_bad_requests_total", label) > \
            metric(before, "semantic_router_bad_requests_total", label), kind
