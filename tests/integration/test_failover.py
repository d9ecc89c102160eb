"""Capabilities and failover through the real Envoy, the router and mock backends that fail on
request, with the official `openai` client: a request never goes to a model that cannot serve it,
and when the model it went to fails (503, 429, no headers in time, refusing connections) the next
model of its route answers, with the body's `model` rewritten for it; never after a stream started."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import openai
import pytest

from devstack.stack import stack_with
from tests.support.stack import ENVOY_FAILOVER_STATS, SESSION_DEADLINE_MS, metric, scrape
from tests.support.waiting import wait_for

CODE = "write a python function that reverses a linked list"
MATH = "solve 3x + 5 = 20"
HEADER_TIMEOUT_MS = 1500
EJECT_AFTER = 3
STALL_MS = HEADER_TIMEOUT_MS + 2000
HEALTH_INTERVAL_S = 0.25
GENERAL = "recommend a novel to read on a long train journey"


def ranked(config: dict) -> None:
    config["server"]["deadline_ms"] = SESSION_DEADLINE_MS
    math, code = config["routes"]
    code.pop("model")  # math keeps its one model: a request it cannot serve takes the default route's
    code["models"] = ["code-model", "math-model", "general-model"]
    config["capabilities"] = [{"model": "math-model", "context_tokens": 2048, "tools": False, "images": False,
                               "structured_output": False}]
    code["idempotent"] = True  # a try that timed out may run again on the next model
    # The default route ranks two models and is not idempotent: a timed-out try ends there.
    config["default_route"].pop("model")
    config["default_route"]["models"] = ["general-model", "code-model"]
    config["failover"] = {"header_timeout_ms": HEADER_TIMEOUT_MS, "eject_after": EJECT_AFTER, "eject_s": 60,
                          "health_interval_s": HEALTH_INTERVAL_S}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, envoy_binary):
    with stack_with(tmp_path_factory.mktemp("failover"), ranked) as s:
        yield s


def client(stack, key: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="not-needed", max_retries=0, timeout=30,
                         default_headers={"x-mock-key": key, **headers})


def chat(stack, prompt: str, model: str = "auto", **headers: str):
    """(response headers, completion, the backends the request reached in order)."""
    key = uuid.uuid4().hex
    raw = client(stack, key, **headers).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": prompt}])
    return raw.headers, raw.parse(), stack.backends.seen.get(key, [])


def healthy(stack) -> None:
    """A request code-model serves: resets its run of failures, so no test ejects it for the next."""
    headers, _, seen = chat(stack, CODE)
    assert seen == ["code-model"] and headers["x-semantic-route-attempts"] == "1"


@pytest.mark.parametrize("failure", [{"x-mock-fail": "code-model=503"}, {"x-mock-fail": "code-model=429"},
                                     {"x-mock-stall": f"code-model={STALL_MS}"}],
                         ids=["503", "429-with-retry-after", "no-headers-in-time"])
def test_a_failing_model_hands_the_request_to_the_next_of_its_route(stack, failure):
    counted = 'model="code-model",outcome="%s"' % (failure.get("x-mock-fail", "=timeout").partition("=")[2])
    before = metric(scrape(stack.metrics_url), "semantic_router_backend_failures_total", counted)
    started = time.monotonic()
    headers, completion, seen = chat(stack, CODE, **failure)
    assert seen == ["code-model", "math-model"]
    assert headers["x-semantic-route-attempts"] == "2"
    assert headers["x-semantic-route-served-model"] == "math-model"
    assert headers["x-selected-model"] == "code-model"  # the router's choice, as it chose
    assert completion.model == "math-model"  # the body's model was rewritten for the attempt
    if "x-mock-stall" in failure:  # moved on at the header timeout, not when the stalled model answered
        assert HEADER_TIMEOUT_MS / 1000 <= time.monotonic() - started < STALL_MS / 1000
    # Envoy reports the failed try, with its model, to the router (esr_extproc/attempt_log.py)
    wait_for(lambda: metric(scrape(stack.metrics_url), "semantic_router_backend_failures_total", counted) == before + 1,
             10, f"the failed try counted ({counted})")
    healthy(stack)


def test_each_failed_model_passes_the_request_on_until_one_answers(stack):
    headers, completion, seen = chat(stack, CODE, **{"x-mock-fail": "code-model=503,math-model=502"})
    assert seen == ["code-model", "math-model", "general-model"] and headers["x-semantic-route-attempts"] == "3"
    assert completion.model == "general-model"
    healthy(stack)


def test_when_every_model_fails_the_client_gets_the_last_error(stack):
    with pytest.raises(openai.InternalServerError) as err:
        chat(stack, CODE, **{"x-mock-status": "503"})
    assert err.value.response.headers["x-semantic-route-attempts"] == "3"
    healthy(stack)


def test_a_stream_that_started_is_never_retried_the_client_sees_the_cut(stack):
    key = uuid.uuid4().hex
    stream = client(stack, key, **{"x-mock-cut": "code-model"}).chat.completions.create(
        model="auto", messages=[{"role": "user", "content": CODE}], stream=True)
    got = []
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert got and stack.backends.seen[key] == ["code-model"]
    healthy(stack)


def test_a_pinned_model_keeps_its_model_and_its_failure(stack):
    with pytest.raises(openai.InternalServerError):
        chat(stack, CODE, model="code-model", **{"x-mock-fail": "code-model=503"})
    healthy(stack)


@pytest.mark.parametrize("ask, lacks", [
    ({"tools": [{"type": "function", "function": {"name": "plot", "parameters": {"type": "object"}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "structured_output"),
    ({"image": True}, "images"),
    ({"system": "Background for the task. " * 600}, "context"),
    ({"max_tokens": 4000}, "context"),
    ({"max_tokens": "4000"}, "context"),  # as backends' pydantic models read it
    ({"extra_body": {"guided_json": {"type": "object"}}}, "structured_output"),
], ids=["tools", "structured-output", "image", "long-prompt", "long-answer", "long-answer-as-text", "guided-json"])
def test_a_request_never_reaches_a_model_that_cannot_serve_it(stack, ask, lacks):
    image, system = ask.pop("image", False), ask.pop("system", None)

    def messages(prompt: str) -> list[dict]:
        turn = {"role": "user", "content": [{"type": "text", "text": prompt}, {
            "type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}] if image else prompt}
        return [{"role": "system", "content": system}, turn] if system else [turn]

    key = uuid.uuid4().hex
    raw = client(stack, key).chat.completions.with_raw_response.create(model="auto", messages=messages(MATH), **ask)
    assert stack.backends.seen[key] == ["general-model"]
    assert raw.headers["x-semantic-route"] == "general" and raw.headers["x-semantic-route-reason"] == "no_capable_model"
    assert raw.headers["x-semantic-route-skipped"] == f"math-model:{lacks}"
    # the same request on the code route: math-model is left out of its failover chain too
    key = uuid.uuid4().hex
    raw = client(stack, key, **{"x-mock-fail": "code-model=503"}).chat.completions.with_raw_response.create(
        model="auto", messages=messages(CODE), **ask)
    assert stack.backends.seen[key] == ["code-model", "general-model"]
    assert raw.headers["x-semantic-route-skipped"] == f"math-model:{lacks}"
    healthy(stack)


def test_a_pinned_model_that_cannot_serve_the_request_is_refused_saying_why(stack):
    with pytest.raises(openai.BadRequestError) as err:
        client(stack, uuid.uuid4().hex).chat.completions.create(
            model="math-model", messages=[{"role": "user", "content": MATH}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert err.value.code == "no_capable_model" and "does not take tools" in err.value.message
    assert metric(scrape(stack.metrics_url), "semantic_router_models_skipped_total",
                  'capability="tools",model="math-model"') >= 1


def test_many_requests_failing_over_at_once_all_reach_the_next_model(stack):
    """A model answering 429 to everyone is never ejected (a 429 is no failure of the model): each
    request fails over, 16 at a time. Envoy's default allows 3 retries in flight per cluster; past
    that a request would get the 429 (upstream_rq_retry_overflow)."""
    answers, lock = [], threading.Lock()

    def worker(n: int) -> None:
        c = client(stack, f"busy-{n}", **{"x-mock-fail": "code-model=429"})
        for i in range(12):
            try:
                raw = c.chat.completions.with_raw_response.create(
                    model="auto", messages=[{"role": "user", "content": f"{CODE} ({n}.{i})"}])
                raw.parse()
                outcome = raw.headers["x-semantic-route-attempts"]
            except openai.APIError as exc:
                outcome = repr(exc)
            with lock:
                answers.append(outcome)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == ["2"] * len(answers) and len(answers) == 16 * 12, sorted(set(answers))
    healthy(stack)


def ejected(stack, model: str) -> float:
    envoy = httpx.get(f"http://127.0.0.1:{stack.ports.admin}/stats/prometheus").text
    return metric(envoy, "envoy_cluster_outlier_detection_ejections_active", f'envoy_cluster_name="{model}"')


def test_a_try_that_timed_out_is_not_run_again_on_a_route_that_is_not_idempotent(stack):
    key = uuid.uuid4().hex
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as err:
        client(stack, key, **{"x-mock-stall": f"general-model={STALL_MS}"}).chat.completions.create(
            model="auto", messages=[{"role": "user", "content": GENERAL}])
    assert err.value.status_code == 504 and time.monotonic() - started < STALL_MS / 1000
    assert stack.backends.seen[key] == ["general-model"]  # code-model, next in the chain, never ran it
    assert err.value.response.headers["x-semantic-route"] == "general"


def test_one_clients_slow_requests_eject_no_model_for_the_others(stack):
    """More timed-out tries in a row than eject_after, on both routes: each model stays in service
    (Envoy's timeouts are local-origin, which eject no one), and the idempotent route's requests each
    ran once more, on the next model."""
    def slow(prompt: str, model: str):
        try:
            return chat(stack, prompt, **{"x-mock-stall": f"{model}={STALL_MS}"})
        except openai.APIStatusError as exc:
            return exc.status_code

    runs = [threading.Thread(target=lambda i=i: outcomes.append(slow(f"{GENERAL} ({i})", "general-model")))
            for i in range(EJECT_AFTER + 2)]
    outcomes: list = []
    for t in runs:
        t.start()
    code = [slow(f"{CODE} ({i})", "code-model") for i in range(EJECT_AFTER + 2)]
    for t in runs:
        t.join()
    assert outcomes == [504] * (EJECT_AFTER + 2)
    assert [seen for _, _, seen in code] == [["code-model", "math-model"]] * (EJECT_AFTER + 2)
    assert ejected(stack, "general-model") == 0 and ejected(stack, "code-model") == 0
    healthy(stack)
    _, _, seen = chat(stack, GENERAL)
    assert seen == ["general-model"]


def test_with_a_backend_refusing_connections_no_request_fails_and_it_is_soon_skipped(stack):
    """The issue's row: one of three backends down at c16 for 20 s; 0 failed. Envoy's health check
    finds it down within two intervals and failover clusters skip it: failover costs the first
    requests only."""
    stack.backends.down("code-model")
    try:
        failed, attempts, lock = [], [], threading.Lock()
        start = time.monotonic()
        until = start + 20

        def worker(n: int) -> None:
            c = client(stack, f"load-{n}")
            i = 0
            while time.monotonic() < until:
                i += 1
                try:
                    raw = c.chat.completions.with_raw_response.create(
                        model="auto", messages=[{"role": "user", "content": f"{CODE} (client {n}, request {i})"}])
                    raw.parse()
                    with lock:
                        attempts.append((time.monotonic() - start, raw.headers["x-semantic-route-attempts"]))
                except openai.APIError as exc:
                    with lock:
                        failed.append(repr(exc))

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failed, (len(failed), len(attempts), failed[:3])
        assert len(attempts) > 100
        retried = [t for t, a in attempts if a != "1"]
        # only until the health check saw it (none, where it saw it before the first request)
        assert max(retried, default=0.0) < 2.0, (len(retried), max(retried))
        # what the dashboard and the alert read of it, from Envoy
        envoy = httpx.get(f"http://127.0.0.1:{stack.ports.admin}/stats/prometheus").text
        for name in ENVOY_FAILOVER_STATS:
            assert f"\n{name}{{" in envoy, name
        assert metric(envoy, "envoy_cluster_upstream_cx_connect_fail", 'envoy_cluster_name="code-model"') >= len(retried)
        assert metric(envoy, "envoy_cluster_health_check_failure", 'envoy_cluster_name="code-model"') >= 2
        assert metric(envoy, "envoy_cluster_membership_healthy", 'envoy_cluster_name="code-model"') == 0
        assert metric(envoy, "envoy_cluster_upstream_rq_retry",
                      'envoy_cluster_name="failover_code-model,math-model,general-model"') >= 1
        # each refused try, by its model
        wait_for(lambda: metric(scrape(stack.metrics_url), "semantic_router_backend_failures_total",
                                'model="code-model",outcome="connect_failure"') == len(retried),
                 10, f"{len(retried)} refused tries counted")
    finally:
        stack.backends.up("code-model")
    wait_for(lambda: "code-model" in chat(stack, CODE)[2], 10, "code-model back in service")


@pytest.fixture(scope="module")
def cached_stack(tmp_path_factory, envoy_binary):
    def cached(config: dict) -> None:
        ranked(config)
        config["cache"] = {"enabled": True}

    with stack_with(tmp_path_factory.mktemp("failover-cached"), cached) as s:
        yield s


def test_an_answer_after_a_failover_is_not_kept_for_the_model_first_tried(cached_stack):
    """The cache keys the body as the router forwarded it (code-model); a fallback model's answer
    is not code-model's, so Envoy's keeper does not keep it."""
    from tests.support.stack import cache_stores

    prompt = f"{CODE} ({uuid.uuid4().hex})"
    kept = cache_stores(cached_stack)
    headers, completion, seen = chat(cached_stack, prompt, **{"x-mock-fail": "code-model=503"})
    assert seen == ["code-model", "math-model"] and completion.model == "math-model"
    headers, completion, seen = chat(cached_stack, prompt)  # not from the cache: code-model answers now
    assert seen == ["code-model"] and completion.model == "code-model"
    wait_for(lambda: cache_stores(cached_stack) == kept + 1, 10, "code-model's answer kept")
    headers, completion, seen = chat(cached_stack, prompt)
    assert seen == [] and completion.model == "code-model"  # and replayed
