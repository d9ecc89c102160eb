"""The response cache's shared store through real Envoys, routers and a real Redis (Debian's
redis-server): what one router kept, another answers; Redis killed under load fails no request."""

from __future__ import annotations

import concurrent.futures
import uuid

import httpx
import pytest

from devstack.redis_server import RedisServer
from devstack.stack import stack_with
from tests.support.stack import SESSION_DEADLINE_MS, metric, scrape
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


def shared(redis_url: str):
    def change(config):
        config["server"]["deadline_ms"] = SESSION_DEADLINE_MS
        config["cache"] = {"enabled": True, "backend": "redis", "redis_url": redis_url,
                           "semantic_routes": ["math"], "semantic_threshold": 0.95}
    return change


@pytest.fixture(scope="module")
def two_routers(tmp_path_factory, envoy_binary, redis_server):
    with stack_with(tmp_path_factory.mktemp("a"), shared(redis_server.url)) as a, \
            stack_with(tmp_path_factory.mktemp("b"), shared(redis_server.url)) as b:
        yield a, b


def post(stack, prompt: str, key: str) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": prompt}]}
    return httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"x-mock-key": key, "authorization": "Bearer sk-team"})


def test_what_one_router_kept_another_answers_exactly_and_semantically(two_routers):
    a, b = two_routers
    key, tag = uuid.uuid4().hex, uuid.uuid4().hex[:6]
    kept = post(a, f"solve the equation 2x + 3 = 11 {tag}", key)
    assert kept.status_code == 200 and "x-semantic-cache" not in kept.headers
    # The write happens once the answer is on its way: the other router sees it a moment later.
    same = wait_for(lambda: (r := post(b, f"solve the equation 2x + 3 = 11 {tag}", key)).headers.get(
        "x-semantic-cache") == "hit" and r, 10, "router b answering from what router a kept")
    assert same.json()["choices"] == kept.json()["choices"]
    near = wait_for(lambda: (r := post(b, f"please solve the equation 2x + 3 = 11 {tag}", key)).headers.get(
        "x-semantic-cache-match") == "semantic" and r, 10, "router b's index fed from router a's entry")
    assert near.json()["choices"] == kept.json()["choices"]
    assert a.backends.attempts[key] == 1 and b.backends.attempts.get(key, 0) <= 2  # b's misses while waiting


def test_redis_killed_under_load_fails_no_request_and_routing_goes_on(tmp_path_factory, envoy_binary):
    redis = RedisServer(tmp_path_factory.mktemp("doomed")).start()
    with stack_with(tmp_path_factory.mktemp("c"), shared(redis.url)) as stack:
        prompts = [f"solve {i}x = {i + 1}" if i % 2 else f"write a python function number {i}" for i in range(120)]
        key = uuid.uuid4().hex

        def one(i: int) -> httpx.Response:
            if i == 40:
                redis.kill()
            return post(stack, prompts[i % 60], key)  # each prompt twice: hits before the kill

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, range(120)))
        assert [r.status_code for r in answers] == [200] * 120
        assert {r.headers["x-semantic-route"] for r in answers} == {"math", "code"}
        assert all(r.headers["x-semantic-route-reason"] == "matched" for r in answers)
        text = scrape(stack.metrics_url)
        assert metric(text, "semantic_router_cache_skips_total", 'reason="store_unavailable"') > 0
    redis.stop()


def test_an_unreadable_shared_entry_is_a_miss_and_the_request_is_routed(two_routers, redis_server):
    """A damaged or foreign value under a request's key once raised inside the ext_proc stream (Envoy
    then passed the request on unrouted): now it is a miss, logged, and the request routes."""
    import json

    import redis as redis_client

    from esr_cache.keys import request_key, tenant_of
    from tests.support.bodies import cache_view_of

    a, _ = two_routers
    key, prompt = uuid.uuid4().hex, f"solve the equation 9x = 18 {uuid.uuid4().hex[:6]}"
    body = {"model": "auto", "messages": [{"role": "user", "content": prompt}]}
    entry = request_key(tenant_of({"authorization": "Bearer sk-team"}, None), "math-model",
                        cache_view_of(body).members)
    with redis_client.Redis.from_url(redis_server.url) as r:
        r.set("esr:cache:" + entry, b"\x80not json", ex=60)
    answer = httpx.post(f"{a.url}/v1/chat/completions", timeout=30, content=json.dumps(body, separators=(",", ":")),
                        headers={"x-mock-key": key, "authorization": "Bearer sk-team",
                                 "content-type": "application/json"})
    assert answer.status_code == 200 and answer.headers["x-semantic-route-reason"] == "matched"
    assert "x-semantic-cache" not in answer.headers and a.backends.attempts[key] == 1
