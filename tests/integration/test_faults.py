"""Model faults through the real Envoy: errors, slowness and overload fall back in time; nothing stalls."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support.fakes import FakeBackend
from tests.support.stack import metric, scrape
from tests.support.inproc_router import inproc_stack_with

MATH = "solve 3x + 5 = 20"  # an utterance of router.yaml: the fake model matches it exactly


class FaultyBackend(FakeBackend):
    """The fake model with a switch: ok, raise (a CUDA-style error), or slow (seconds per batch)."""

    def __init__(self):
        super().__init__()
        self.mode = "ok"
        self.delay = 2.0

    def embed(self, token_ids, deadline=None):
        if self.mode == "raise":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if self.mode == "slow":
            time.sleep(self.delay)
        return super().embed(token_ids)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory, envoy_binary):
    def change(cfg):
        cfg["cache_size"] = 0
        cfg["static_tier"] = {"enabled": False}  # every prompt reaches the faulty model, none is decided before it
        cfg["batching"].update(max_batch_size=1, max_queue_requests=2)
        cfg["server"]["deadline_ms"] = 500

    backend = FaultyBackend()
    with inproc_stack_with(tmp_path_factory.mktemp("faults"), backend, change) as stack:
        yield stack, backend


def ask(stack, prompt=MATH):
    t0 = time.monotonic()
    r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=10,
                   json={"model": "auto", "messages": [{"role": "user", "content": prompt}]})
    return r, time.monotonic() - t0


def wait_idle(backend):
    """Let a slow batch still on the model thread finish."""
    backend.mode = "ok"
    time.sleep(backend.delay + 0.2)


def test_model_error_falls_back_and_batcher_keeps_serving(faulty):
    stack, backend = faulty
    assert ask(stack)[0].headers["x-semantic-route"] == "math"
    backend.mode = "raise"
    r, _ = ask(stack)
    assert r.status_code == 200
    assert r.headers["x-mock-backend"] == "general-model"
    assert r.headers["x-semantic-route-reason"] == "fallback_error"
    assert r.json()["model"] == "general-model"  # "auto" still becomes a model the backend serves
    backend.mode = "ok"
    assert ask(stack)[0].headers["x-semantic-route-reason"] == "matched"


def test_slow_model_falls_back_within_the_deadline(faulty):
    stack, backend = faulty
    backend.mode = "slow"
    r, _ = ask(stack)
    assert r.status_code == 200
    # The router's own answer at its 0.5 s deadline: had Envoy's 1 s message timeout fired first,
    # the request would have gone on unrouted, with no reason header.
    assert r.headers["x-semantic-route-reason"] == "fallback_timeout"
    assert r.headers["x-mock-backend"] == "general-model"
    assert r.json()["model"] == "general-model"
    wait_idle(backend)
    assert ask(stack)[0].headers["x-semantic-route-reason"] == "matched"


def test_overload_falls_back_at_once_and_is_counted(faulty):
    stack, backend = faulty
    text = scrape(stack.metrics_url)
    before = metric(text, "semantic_router_requests_total", 'outcome="fallback_overload"')
    quick_before = metric(text, "semantic_router_processing_seconds_bucket", 'le="0.1"')
    backend.mode, backend.delay = "slow", 0.4
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda _: ask(stack), range(12)))
    wait_idle(backend)
    reasons = [r.headers["x-semantic-route-reason"] for r, _ in results]
    assert all(r.status_code == 200 for r, _ in results)
    assert "fallback_overload" in reasons
    # Refused without waiting for the model: the router answered each within 0.1 s of its body (its
    # own clock; what the client sees also holds Envoy and the mock backends, which share this
    # process and its GIL with the in-process router and 12 client threads: alone, this test saw
    # every answer at ~0.45 s, also before the adversarial work).
    text = scrape(stack.metrics_url)
    quick = metric(text, "semantic_router_processing_seconds_bucket", 'le="0.1"') - quick_before
    # Up to max_queue_requests (2) admitted ones may be refused late instead, when their batch is cut.
    assert quick >= reasons.count("fallback_overload") - 2 >= 1
    after = metric(text, "semantic_router_requests_total", 'outcome="fallback_overload"')
    assert after - before == reasons.count("fallback_overload")
