"""The response cache through the real Envoy, the router and the mock backends, with the official
`openai` client: the same request twice reaches the backend once, in either shape (JSON or a
stream), and never across tenants, conversations, opt-outs or errors."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from devstack.stack import stack_with
from tests.support.stack import DUPLEX, SESSION_DEADLINE_MS, cache_stores, metric, scrape
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def cached_stack(tmp_path_factory, envoy_binary):
    def cached(config):
        config["server"]["deadline_ms"] = SESSION_DEADLINE_MS
        config["cache"] = {"enabled": True}
        config["routes"][0]["set_body"] = {"reasoning_effort": "high"}  # math

    with stack_with(tmp_path_factory.mktemp("cached"), cached) as s:
        yield s


def wait_kept(stack, before: float, n: int = 1) -> None:
    """Behind the keeper an answer is handed to the router after it has gone to the client: a
    request sent at once after it may still miss, so the tests wait for the keep."""
    wait_for(lambda: cache_stores(stack) >= before + n, 10, f"{n} more answer(s) kept")


def client(stack, key: str, tenant: str = "sk-tenant-a") -> openai.OpenAI:
    # x-mock-key: the mock backends count the requests that reach them under it.
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=tenant, max_retries=0,
                         default_headers={"x-mock-key": key})


def ask(stack, key: str, prompt: str, **kw):
    return client(stack, key, kw.pop("tenant", "sk-tenant-a")).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": prompt}], **kw)


def test_the_same_request_twice_reaches_the_backend_once(cached_stack):
    key, prompt = uuid.uuid4().hex, f"solve the equation 2x + 3 = 11 ({uuid.uuid4().hex[:6]})"
    before = cache_stores(cached_stack)
    first = ask(cached_stack, key, prompt, temperature=0)
    wait_kept(cached_stack, before)
    second = ask(cached_stack, key, prompt, temperature=0)
    assert "x-semantic-cache" not in first.headers and second.headers["x-semantic-cache"] == "hit"
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert second.headers["x-semantic-route"] == "math" and int(second.headers["age"]) >= 0
    assert cached_stack.backends.attempts[key] == 1
    # Another parameter, another tenant: another answer.
    ask(cached_stack, key, prompt, temperature=0.5)
    ask(cached_stack, key, prompt, temperature=0, tenant="sk-tenant-b")
    assert cached_stack.backends.attempts[key] == 3


def test_a_streamed_answer_is_kept_as_it_passes_and_replayed_to_the_sdk(cached_stack):
    key, prompt = uuid.uuid4().hex, f"write a python function that reverses a list ({uuid.uuid4().hex[:6]})"

    def streamed():
        chunks = list(client(cached_stack, key).chat.completions.create(
            model="auto", messages=[{"role": "user", "content": prompt}], stream=True))
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1]

    before = cache_stores(cached_stack)
    text, _ = streamed()
    wait_kept(cached_stack, before)
    again, last = streamed()
    assert again == text and text.startswith("[code-model]")
    assert cached_stack.backends.attempts[key] == 1
    # The streamed entry answers the same request unstreamed, too.
    plain = ask(cached_stack, key, prompt)
    assert plain.headers["x-semantic-cache"] == "hit" and plain.parse().choices[0].message.content == text
    assert cached_stack.backends.attempts[key] == 1


def test_a_streamed_answer_is_kept_when_the_sdk_closes_at_done_before_the_stream_ends(cached_stack):
    # The OpenAI SDK stops reading at [DONE] and closes the connection: where the backend's stream
    # ends later, Envoy sees the client reset it first. The keeper hands the answer over at its
    # [DONE]; it waited for the end before, and such an answer was never kept (a test's race).
    key, prompt = uuid.uuid4().hex, f"write a python function that sorts a list ({uuid.uuid4().hex[:6]})"
    sdk = openai.OpenAI(base_url=f"{cached_stack.url}/v1", api_key="sk-tenant-a", max_retries=0,
                        default_headers={"x-mock-key": key, "x-mock-linger-ms": "3000"})
    before = cache_stores(cached_stack)
    chunks = list(sdk.chat.completions.create(model="auto", messages=[{"role": "user", "content": prompt}],
                                              stream=True))
    assert chunks[-1].choices[0].finish_reason == "stop"
    wait_kept(cached_stack, before)
    again = ask(cached_stack, key, prompt)
    assert again.headers["x-semantic-cache"] == "hit" and cached_stack.backends.attempts[key] == 1


def test_a_later_turn_hits_only_the_same_conversation(cached_stack):
    key = uuid.uuid4().hex
    one = [{"role": "user", "content": "solve 2x = 4"}, {"role": "assistant", "content": "x = 2"}]
    two = [{"role": "user", "content": "write a python function"}, {"role": "assistant", "content": "def f(): ..."}]
    follow = {"role": "user", "content": "Yes, please"}
    for history in (one, two):
        before = cache_stores(cached_stack)
        client(cached_stack, key).chat.completions.create(model="auto", messages=[*history, follow])
        wait_kept(cached_stack, before)
    client(cached_stack, key).chat.completions.create(model="auto", messages=[*one, follow])
    assert cached_stack.backends.attempts[key] == 2  # the third is the first conversation again


def test_opt_outs_and_errors_are_never_kept(cached_stack):
    key, prompt = uuid.uuid4().hex, f"solve 5x = 10 ({uuid.uuid4().hex[:6]})"
    body = {"model": "auto", "messages": [{"role": "user", "content": prompt}]}
    with httpx.Client(base_url=cached_stack.url, timeout=30) as http:
        for headers in ({"cache-control": "no-store"}, {"x-semantic-cache": "bypass"}):
            for _ in range(2):
                assert http.post("/v1/chat/completions", json=body, headers={"x-mock-key": key, **headers}).status_code == 200
        assert cached_stack.backends.attempts[key] == 4
        for _ in range(2):
            failed = http.post("/v1/chat/completions", json=body, headers={"x-mock-key": key, "x-mock-status": "503"})
            assert failed.status_code == 503 and "x-semantic-cache" not in failed.headers
        assert cached_stack.backends.attempts[key] == 6
    text = scrape(cached_stack.metrics_url)
    assert metric(text, "semantic_router_cache_skips_total", 'reason="no_store"') >= 4
    # The keeper hands an answer to the router after it has gone to the client: its verdict lands
    # a moment after the response.
    wait_for(lambda: metric(scrape(cached_stack.metrics_url), "semantic_router_cache_skips_total",
                            'reason="not_ok"') >= 2, 10, "both error answers judged not_ok")
    # Nothing of the above was kept: the same request without opting out goes to the backend once,
    # and then is answered from the cache (this test's own hit, whatever ran before it).
    with httpx.Client(base_url=cached_stack.url, timeout=30) as http:
        before = cache_stores(cached_stack)
        assert http.post("/v1/chat/completions", json=body, headers={"x-mock-key": key}).status_code == 200
        wait_kept(cached_stack, before)
        again = http.post("/v1/chat/completions", json=body, headers={"x-mock-key": key})
        assert again.status_code == 200 and again.headers.get("x-semantic-cache") == "hit"
    assert cached_stack.backends.attempts[key] == 7
    assert metric(scrape(cached_stack.metrics_url), "semantic_router_cache_lookups_total", 'result="hit"') >= 1


@pytest.fixture(scope="module")
def semantic_stack(tmp_path_factory, envoy_binary):
    def cached(config):
        config["server"]["deadline_ms"] = SESSION_DEADLINE_MS
        config["cache"] = {"enabled": True, "semantic_routes": ["math"], "semantic_threshold": 0.95}

    with stack_with(tmp_path_factory.mktemp("semantic"), cached) as s:
        yield s


def test_a_turn_that_means_the_same_takes_the_answer_on_semantic_routes_only(semantic_stack):
    key, tag = uuid.uuid4().hex, uuid.uuid4().hex[:6]
    before = cache_stores(semantic_stack)
    first = ask(semantic_stack, key, f"solve the equation 2x + 3 = 11 {tag}")
    wait_kept(semantic_stack, before)
    near = ask(semantic_stack, key, f"please solve the equation 2x + 3 = 11 {tag}")  # cosine ~0.99
    assert "x-semantic-cache" not in first.headers
    assert (near.headers["x-semantic-cache"], near.headers["x-semantic-cache-match"]) == ("hit", "semantic")
    assert near.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert semantic_stack.backends.attempts[key] == 1
    ask(semantic_stack, key, f"solve 5x = 10 {tag}")  # another question on the same route
    ask(semantic_stack, key, f"please solve the equation 2x + 3 = 11 {tag}", tenant="sk-tenant-b")  # another tenant
    # The same turn after another conversation: another scope.
    client(semantic_stack, key).chat.completions.create(model="auto", messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": f"please solve the equation 2x + 3 = 11 {tag}"}])
    assert semantic_stack.backends.attempts[key] == 4
    # The code route has no semantic matching: a near paraphrase there is a miss.
    before = cache_stores(semantic_stack)
    ask(semantic_stack, key, f"write a python function that reverses a list {tag}")
    wait_kept(semantic_stack, before)  # kept: the miss below is the route's rule, not timing
    code = ask(semantic_stack, key, f"please write a python function that reverses a list {tag}")
    assert "x-semantic-cache" not in code.headers and semantic_stack.backends.attempts[key] == 6


def test_the_key_is_the_body_as_forwarded_so_pinned_and_routed_answers_stay_apart(cached_stack):
    """The math route's set_body adds reasoning_effort: a pinned request to math-model that does
    not send it is another request to the backend, and takes (or gives) no answer of the routed one."""
    key, prompt = uuid.uuid4().hex, f"solve the equation 7x = 14 ({uuid.uuid4().hex[:6]})"

    def send(model: str, **extra) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], **extra}
        return httpx.post(f"{cached_stack.url}/v1/chat/completions", json=body, timeout=30,
                          headers={"x-mock-key": key, "authorization": "Bearer sk-forwarded"})

    before = cache_stores(cached_stack)
    pinned = send("math-model")
    assert pinned.headers["x-semantic-route-reason"] == "model_pinned"
    assert "reasoning_effort" not in pinned.json()["mock"]["fields"]
    wait_kept(cached_stack, before)  # kept, so that the routed request's miss means something
    routed = send("auto")
    assert routed.headers["x-semantic-route"] == "math" and "x-semantic-cache" not in routed.headers
    assert routed.json()["mock"]["fields"]["reasoning_effort"] == "high"
    assert cached_stack.backends.attempts[key] == 2
    wait_kept(cached_stack, before, 2)
    assert send("auto").headers["x-semantic-cache"] == "hit" and send("math-model").headers["x-semantic-cache"] == "hit"
    # A pinned request that sends what the route would have added is the same request to the backend.
    same = send("math-model", reasoning_effort="high")
    assert same.headers["x-semantic-cache"] == "hit" and same.json()["mock"]["fields"]["reasoning_effort"] == "high"
    assert cached_stack.backends.attempts[key] == 2


def test_a_key_repeated_in_a_member_nobody_reads_is_refused_before_the_cache_keys_it(cached_stack):
    raw = (b'{"model":"auto","metadata":{"team":"a","team":"b"},'
           b'"messages":[{"role":"user","content":"solve 2x = 8"}]}')
    r = httpx.post(f"{cached_stack.url}/v1/chat/completions", content=raw, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "duplicate_key" and "x-mock-backend" not in r.headers


def test_a_client_cannot_write_the_tenant_header(tmp_path_factory, envoy_binary):
    """With cache.tenant_header the rendered Envoy drops the client's copy before any filter: two
    clients naming different tenants (or another's) are one tenant, the one without credentials."""
    def tenants(config):
        config["server"]["deadline_ms"] = SESSION_DEADLINE_MS
        config["cache"] = {"enabled": True, "tenant_header": "x-tenant"}

    with stack_with(tmp_path_factory.mktemp("tenants"), tenants) as stack:
        key, prompt = uuid.uuid4().hex, f"solve 3x = 12 ({uuid.uuid4().hex[:6]})"
        body = {"model": "auto", "messages": [{"role": "user", "content": prompt}]}
        before = cache_stores(stack)
        first = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=30,
                           headers={"x-mock-key": key, "x-tenant": "team-a"})
        assert "x-tenant" not in first.json()["mock"]["headers"]  # neither the router nor the backend saw it
        wait_kept(stack, before)
        second = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=30,
                            headers={"x-mock-key": key, "x-tenant": "team-b"})
        assert second.headers["x-semantic-cache"] == "hit" and stack.backends.attempts[key] == 1


def _long_stream(stack, key: str, prompt: str) -> str:
    body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"x-mock-key": key, "x-mock-chunks": "500"}) as r:
        assert r.status_code == 200
        return b"".join(r.iter_bytes()).decode()


def test_a_500_chunk_answer_is_kept_by_envoys_keeper(cached_stack):
    key, prompt = uuid.uuid4().hex, f"solve 11x = 22 ({uuid.uuid4().hex[:6]})"
    before = cache_stores(cached_stack)
    first = _long_stream(cached_stack, key, prompt)
    assert first.count("data: ") > 500 and first.endswith("data: [DONE]\n\n")
    wait_kept(cached_stack, before)
    again = _long_stream(cached_stack, key, prompt)
    assert " w499" in again and cached_stack.backends.attempts[key] == 1


def test_behind_a_gateway_without_the_keeper_the_router_watches_the_answer(tmp_path_factory, envoy_binary):
    """Envoy rendered without the cache (so without the keeper), the router's cache on: the router
    asks Envoy at the headers phase to stream the answer through it, as on any other gateway."""
    def cached(config):
        config["server"]["deadline_ms"] = SESSION_DEADLINE_MS
        config["cache"] = {"enabled": True}

    with stack_with(tmp_path_factory.mktemp("no-keeper"), cached, envoy_change=lambda c: c.pop("cache")) as stack:
        key, prompt = uuid.uuid4().hex, f"solve 13x = 26 ({uuid.uuid4().hex[:6]})"
        before = cache_stores(stack)
        first = _long_stream(stack, key, prompt)
        if not DUPLEX:
            # Watched, the answer is kept as its last chunk passes the router; one this large is read
            # on a thread (ResponseCache.keep_soon), so the keep may land after the client has it all.
            wait_kept(stack, before)
            assert cache_stores(stack) == before + 1
        again = _long_stream(stack, key, prompt)
        assert " w499" in first and " w499" in again
        # Full duplex takes no mode override: without the keeper the answer is not seen, not kept.
        assert stack.backends.attempts[key] == (2 if DUPLEX else 1)
