"""The router behind Envoy configured as each gateway configures it from the shipped manifests
(tests/support/gateways.py): the filter Istio's EnvoyFilter inserts for the Inference Extension
(routes on x-gateway-model-name, as its HTTPRoute's), Envoy Gateway's EnvoyExtensionPolicy in each of its body modes, with
HTTPRoute-style routes on x-gateway-model-name; Envoy AI Gateway with the router inserted first by
the EnvoyPatchPolicy and routes on the x-ai-eg-model its own filter reads from the rewritten body.
Through the official openai client and the mock backends: routing, a conversation, the guard, the
cache, a 4 MiB body, a body in many small chunks with gaps, a slow upload beside fast requests."""

from __future__ import annotations

import concurrent.futures
import json
import time
import uuid

import httpx
import openai
import pytest

from devstack.stack import stack_with
from tests.support.stack import GUARDED, SESSION_DEADLINE_MS, cache_stores, metric, scrape
from tests.support.gateways import (AI_GATEWAY_MODEL, ai_gateway_patch, envoy_filter_inserted, extension_policy_filter,
                                    in_place_of_the_routers_filter, manifest)
from tests.support.waiting import wait_for

GATEWAYS = {
    # name: (the header routes are rendered on, None: x-selected-model, which AI Gateway's patch
    # turns into x-ai-eg-model; the Envoy patch; whether the router sees answers to keep)
    # Istio's EnvoyFilter for the Inference Extension: full duplex, no fail-open, overrides allowed.
    "inference-extension": ("x-gateway-model-name", lambda: in_place_of_the_routers_filter(
        envoy_filter_inserted(manifest("inference-extension", "EnvoyFilter"))), False),
    "envoy-gateway-buffered": ("x-gateway-model-name", lambda: in_place_of_the_routers_filter(
        extension_policy_filter(manifest("envoy-gateway", "EnvoyExtensionPolicy"))), True),
    "envoy-gateway-streamed": ("x-gateway-model-name", lambda: in_place_of_the_routers_filter(
        extension_policy_filter(manifest("envoy-gateway", "EnvoyExtensionPolicy"), "Streamed")), True),
    # Envoy takes no mode override in full duplex: no answer comes back to keep.
    "envoy-gateway-full-duplex": ("x-gateway-model-name", lambda: in_place_of_the_routers_filter(
        extension_policy_filter(manifest("envoy-gateway", "EnvoyExtensionPolicy"), "FullDuplexStreamed")), False),
    "ai-gateway": (None, ai_gateway_patch, True),
}


def deployed(header: str | None, cache: bool):
    """The router's config behind a gateway: the guard, the routes on `header`, the cache or not."""
    def change(config):
        config["server"]["deadline_ms"] = SESSION_DEADLINE_MS
        config["filters"] = ["prompt_guard", "model_policy", "semantic_route"]
        config["filter_settings"] = {"prompt_guard": {"exemplars": [GUARDED], "threshold": 0.9}}
        if cache:
            config["cache"] = {"enabled": True}
        config.setdefault("envoy", {})["route_header"] = header
    return change


def as_the_gateway_routes(config) -> None:
    """The gateway's own routes send what matches no model header to the default backend (the
    manifests' HTTPRoutes): the rendered catch-all as theirs, whatever the router's policy."""
    config.setdefault("envoy", {})["undecided"] = "default"


@pytest.fixture(scope="module", params=list(GATEWAYS))
def gateway(request, tmp_path_factory, envoy_binary):
    header, patch, keeps = GATEWAYS[request.param]

    def without_our_keeper(config):  # the gateway runs no filter of ours but the ext_proc
        config.pop("cache")
        as_the_gateway_routes(config)

    with stack_with(tmp_path_factory.mktemp(request.param), deployed(header, cache=True),
                    envoy_change=without_our_keeper, envoy_patch=patch()) as stack:
        yield request.param, header, keeps, stack


def client(stack, key: str = "") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk-test", max_retries=0, timeout=30,
                         default_headers={"x-mock-key": key or uuid.uuid4().hex})


def chat(stack, messages, key: str = ""):
    return client(stack, key).chat.completions.with_raw_response.create(model="auto", messages=messages)


@pytest.mark.parametrize("prompt, model", [
    ("Solve the equation 4x - 7 = 21 for x", "math-model"),
    ("Write a Python function that reverses a linked list", "code-model"),
    ("What's a good name for a golden retriever puppy?", "general-model"),
])
def test_every_prompt_reaches_the_model_the_router_chose(gateway, prompt, model):
    name, header, _, stack = gateway
    header = header or AI_GATEWAY_MODEL
    # Each prompt once a stack: no nonce (hex digits lean a prompt towards math).
    raw = chat(stack, [{"role": "user", "content": prompt}])
    assert raw.headers["x-mock-backend"] == model, name
    answer = raw.parse()
    assert answer.model_extra["mock"]["headers"][header] == model and answer.model == model


def test_a_conversation_keeps_its_route_on_a_follow_up(gateway):
    _, _, _, stack = gateway
    convo = [{"role": "user", "content": "Solve the equation 4x - 7 = 21 for x"},
             {"role": "assistant", "content": "x = 7."},
             {"role": "user", "content": "Thanks! Can you go over that last step once more?"}]
    raw = chat(stack, convo)
    assert (raw.headers["x-mock-backend"], raw.headers["x-semantic-route-reason"]) == ("math-model", "context")


def test_the_guard_blocks_before_any_backend(gateway):
    _, _, _, stack = gateway
    key = uuid.uuid4().hex
    with pytest.raises(openai.PermissionDeniedError):
        chat(stack, [{"role": "user", "content": GUARDED}], key)
    assert stack.backends.attempts.get(key, 0) == 0


def test_the_same_request_twice_is_answered_from_the_cache_where_the_router_sees_answers(gateway):
    name, _, keeps, stack = gateway
    key, prompt = uuid.uuid4().hex, f"compute 17 times 23 ({uuid.uuid4().hex[:6]})"
    before = cache_stores(stack)
    chat(stack, [{"role": "user", "content": prompt}], key)
    if keeps:
        wait_for(lambda: cache_stores(stack) >= before + 1, 10, "the answer kept")
    second = chat(stack, [{"role": "user", "content": prompt}], key)
    assert second.headers["x-mock-backend" if not keeps else "x-semantic-cache"] == (
        "math-model" if not keeps else "hit"), name
    assert stack.backends.attempts[key] == (1 if keeps else 2)


def _body(prompt: str, pad: int = 0) -> bytes:
    messages = [{"role": "user", "content": "x" * pad}] if pad else []
    return json.dumps({"model": "auto", "messages": [*messages, {"role": "user", "content": prompt}]}).encode()


def test_a_4_mib_body_is_routed(gateway):
    _, _, _, stack = gateway
    body = _body("Write a Python function that merges two sorted lists", pad=4_000_000)
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=body, timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.headers["x-mock-backend"] == "code-model"
    assert r.json()["mock"]["body_bytes"] == len(body) - len("auto") + len("code-model")  # rewritten


def _paced(body: bytes, chunk: int, gap_s: float):
    for i in range(0, len(body), chunk):
        yield body[i:i + chunk]
        time.sleep(gap_s)


def test_a_body_in_many_small_chunks_with_gaps_is_routed(gateway):
    _, _, _, stack = gateway
    body = _body("Solve the equation 3x + 5 = 20 for x", pad=20_000)
    r = httpx.post(f"{stack.url}/v1/chat/completions", content=_paced(body, 512, 0.005), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.headers["x-mock-backend"] == "math-model"


def test_a_slow_upload_holds_nothing_but_itself(gateway):
    _, _, _, stack = gateway
    slow_body = _body("Write a bash script that renames all files in a folder", pad=200_000)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(httpx.post, f"{stack.url}/v1/chat/completions", timeout=60,
                           content=_paced(slow_body, 16 * 1024, 0.4), headers={"content-type": "application/json"})
        fast = []
        for i in range(5):
            raw = chat(stack, [{"role": "user", "content": f"compute {i} times 23"}])
            fast.append(raw.headers["x-mock-backend"])
        assert not slow.done(), "the slow upload (13 chunks 0.4 s apart) ended before the fast requests"
        assert fast == ["math-model"] * 5
        assert slow.result().headers["x-mock-backend"] == "code-model"


def test_streamed_without_mode_overrides_is_a_counted_fallback_not_a_misroute(tmp_path_factory, envoy_binary):
    """Envoy Gateway's Streamed with allowModeOverride false: the headers go on to routing before
    the body is read. The router cannot route there: the request keeps the gateway's default route
    and its body as sent, the guard still blocks, and the metric and log say what to change."""
    policy = manifest("envoy-gateway", "EnvoyExtensionPolicy")
    policy["spec"]["extProc"][0]["processingMode"]["allowModeOverride"] = False

    patch = in_place_of_the_routers_filter(extension_policy_filter(policy, "Streamed"))
    with stack_with(tmp_path_factory.mktemp("streamed-no-override"), deployed("x-gateway-model-name", cache=False),
                    envoy_change=as_the_gateway_routes, envoy_patch=patch) as stack:
        body = _body("Solve the equation 4x - 7 = 21 for x", pad=100_000)
        r = httpx.post(f"{stack.url}/v1/chat/completions", content=_paced(body, 16 * 1024, 0.01), timeout=30,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.headers["x-mock-backend"] == "general-model"
        assert r.json()["mock"]["body_bytes"] == len(body)
        key = uuid.uuid4().hex
        with pytest.raises(openai.PermissionDeniedError):
            chat(stack, [{"role": "user", "content": "x" * 100_000}, {"role": "user", "content": GUARDED}], key)
        assert stack.backends.attempts.get(key, 0) == 0
        text = scrape(stack.metrics_url)
        assert metric(text, "semantic_router_bad_requests_total", 'kind="streamed_unbuffered"') >= 1
        assert "allowModeOverride" in stack.log_tail("router", 200)
