"""A pool (server.workers: 2, one model process) through the real Envoy: it routes, one /metrics
shows every process, a score posted to one worker is folded in by both, a killed worker is
replaced, a killed model process means fallbacks (never errors or hangs) until it is back."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import dataclasses

import httpx
import numpy as np
import pytest
import yaml

from devstack.stack import ROOT, Stack, StackPorts
from esr_app.routing_build import static_tier
from esr_config import load_config
from router.selection import QualityModel, save_quality
from tests.support.extproc import body_msg, headers_msg, route_once, send_once
from tests.support.stack import ask, metric, scrape
from tests.support.waiting import wait_for


@pytest.fixture(scope="module")
def pool(tmp_path_factory, envoy_binary):
    workdir = tmp_path_factory.mktemp("pool")
    config = yaml.safe_load((ROOT / "router.yaml").read_text())
    config["server"]["workers"] = 2
    config["cache_size"] = 0  # every request a worker's static tier leaves reaches the model process
    # Selection with feedback on the math route; its predictions (bias only, from either tier's
    # vectors: general-model 0.5, under the floor; math-model 0.95) keep math-model chosen, as the
    # routing tests expect.
    def bias_only(dimension: int) -> QualityModel:
        weights = np.zeros((2, dimension + 1), dtype=np.float32)
        weights[:, -1] = (0.5, 0.95)
        return QualityModel(("general-model", "math-model"), weights, np.array([0.02, 0.02], np.float32), 0.1)

    static_dimension = static_tier(load_config(ROOT / "router.yaml")).encode(["x"]).shape[-1]
    save_quality(dataclasses.replace(bias_only(384), static=bias_only(static_dimension)),
                 str(workdir / "quality.npz"), "bundled:all-MiniLM-L6-v2")
    next(r for r in config["routes"] if r["name"] == "math")["models"] = ["math-model", "general-model"]
    config["selection"] = {"path": str(workdir / "quality.npz"), "quality_floor": 0.8,
                           "prices": {"general-model": 1, "math-model": 10},
                           "feedback": {"enabled": True, "explore": 0.0}}
    (workdir / "router.yaml").write_text(yaml.safe_dump(config))
    stack = Stack(workdir, StackPorts.free(workdir / "router.yaml"), router_config=workdir / "router.yaml",
                  router_env={"SEMANTIC_ROUTER_FEEDBACK_TOKEN": FEEDBACK_TOKEN})
    stack.start(timeout=300)
    # Serving, not only running: a worker still building its routes has not bound the port, and
    # the kernel would deal every connection to its sibling.
    wait_for(lambda: all_ready(stack), 120, "every pool process serving")
    yield stack
    stack.stop()


FEEDBACK_TOKEN = "feedback-token-for-the-pool-test"


def all_ready(stack) -> bool:
    text = scrape(stack.metrics_url)
    return all(metric(text, "semantic_router_pool_process_up", f'process="{p}"') == 1
               and metric(text, "semantic_router_pool_process_ready", f'process="{p}"') == 1
               for p in ("model", "worker-0", "worker-1"))


def pid_of(stack, process: str) -> int:
    return int(metric(scrape(stack.metrics_url), "semantic_router_pool_process_pid", f'process="{process}"'))


@pytest.mark.parametrize("prompt, backend", [
    ("solve the equation 2x + 3 = 11", "math-model"),
    ("write a python function that reverses a string", "code-model"),
])
def test_the_pool_routes_through_envoy(pool, prompt, backend):
    r = ask(pool, prompt)
    assert r.status_code == 200
    assert r.headers["x-mock-backend"] == backend
    assert r.headers["x-semantic-route-reason"] == "matched"


def test_one_metrics_endpoint_shows_every_process_and_the_shared_batches(pool):
    before = scrape(pool.metrics_url)
    prompts = [f"what is {i} times {i + 7}" for i in range(48)]
    with ThreadPoolExecutor(16) as ex:  # a connection per request: the kernel spreads them over the workers
        answers = list(ex.map(lambda p: route_once(pool.ports.router_grpc, p), prompts))
    assert all(a.get("x-semantic-route-reason") == "matched" for a in answers)
    after = scrape(pool.metrics_url)

    def grew(name, labels=""):
        return metric(after, name, labels) - metric(before, name, labels)

    by_worker = {w: grew("semantic_router_ext_proc_streams_total", f'process="{w}"') for w in ("worker-0", "worker-1")}
    assert sum(by_worker.values()) == len(prompts)
    assert all(n > 0 for n in by_worker.values()), by_worker  # 48 connections: both took some
    # One model process embedded them all, but those a worker's static tier decided itself.
    static = grew("semantic_router_decisions_by_tier_total", 'tier="static"')
    assert grew("semantic_router_batch_size_sum") + static == len(prompts)
    assert grew("semantic_router_batch_size_count") >= 1
    # The workers sent token ids (they have the model's tokenizer): the model process tokenized none.
    assert grew("semantic_router_tokenized_total", 'by="caller"') == len(prompts) - static
    assert grew("semantic_router_tokenized_total", 'by="batcher"') == 0
    assert grew("semantic_router_requests_total", 'outcome="matched"') == len(prompts)
    for process in ("model", "worker-0", "worker-1"):
        assert metric(after, "semantic_router_process_cpu_seconds", f'process="{process}"') > 0


def test_a_score_posted_to_one_worker_is_folded_in_by_the_other(pool):
    """Each score reaches one worker (SO_REUSEPORT deals the connections); the model process passes
    it on, so both workers' corrections count every score."""
    def counted(outcome: str) -> float:
        return metric(scrape(pool.metrics_url), "semantic_router_selection_feedback_total", f'outcome="{outcome}"')

    before = {k: counted(k) for k in ("accepted", "shared")}
    posted = 0
    for i in range(12):  # a connection each: both workers take some
        r = httpx.post(f"{pool.url}/v1/chat/completions", timeout=30,
                       json={"model": "auto", "messages": [{"role": "user", "content": f"solve 2x + {i} = 11"}]})
        assert r.status_code == 200 and r.headers["x-mock-backend"] == "math-model"
        scored = httpx.post(f"{pool.url}/semantic-router/feedback", timeout=30,
                            headers={"authorization": f"Bearer {FEEDBACK_TOKEN}"},
                            json={"selection_id": r.headers["x-semantic-selection-id"], "score": 0.9})
        assert scored.status_code == 200, scored.text
        posted += 1
    wait_for(lambda: counted("shared") - before["shared"] == posted, 10,
             "every accepted score folded in by the other worker")
    assert counted("accepted") - before["accepted"] == posted


def test_one_requests_score_posted_to_both_workers_at_once_is_taken_once(pool):
    """The model process takes each request's score once: of the same id posted on several
    connections at once (the kernel deals them over both workers), one is accepted, the rest 409."""
    def post(selection_id: str) -> int:
        head = headers_msg("/semantic-router/feedback", extra=[("authorization", f"Bearer {FEEDBACK_TOKEN}")])
        answer = send_once(pool.ports.router_grpc, [head, body_msg({"selection_id": selection_id, "score": 0.9})])
        return answer.immediate_response.status.code

    for i in range(6):
        selection_id = route_once(pool.ports.router_grpc, f"solve 3x + {i} = 20")["x-semantic-selection-id"]
        with ThreadPoolExecutor(6) as ex:
            statuses = sorted(ex.map(post, [selection_id] * 6))
        assert statuses == [200] + [409] * 5, statuses


def test_a_killed_worker_is_replaced_and_requests_keep_being_answered(pool):
    old = pid_of(pool, "worker-0")
    os.kill(old, signal.SIGKILL)
    statuses = []
    end = time.monotonic() + 120
    while time.monotonic() < end:
        statuses.append(ask(pool, "solve the equation 2x + 3 = 11").status_code)
        text = scrape(pool.metrics_url)
        if (metric(text, "semantic_router_pool_restarts_total", 'process="worker-0"') == 1
                and metric(text, "semantic_router_pool_process_up", 'process="worker-0"') == 1
                and metric(text, "semantic_router_pool_process_ready", 'process="worker-0"') == 1
                and pid_of(pool, "worker-0") != old):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("worker-0 was not started again")
    assert set(statuses) == {200}  # Envoy never failed a request meanwhile
    # The new worker serves once it has its engine: a burst of fresh connections reaches both.
    wait_for(lambda: all(route_once(pool.ports.router_grpc, "compute 17 times 23").get("x-semantic-route-reason")
                         == "matched" for _ in range(8)), 120, "the replaced worker routes")


UNSURE = "tell me about the history of the Roman empire"  # the default route's: always the encoder's to decide
# math's by the static tier's choice, below its margin: the encoder's to decide, its guess where the encoder cannot.
LEANING = "what is the derivative of x squared times sin x"


WORKERS = ("worker-0", "worker-1")


def worker_restarts(pool) -> dict[str, float]:
    text = scrape(pool.metrics_url)
    return {w: metric(text, "semantic_router_pool_restarts_total", f'process="{w}"') for w in WORKERS}


def test_a_killed_model_process_means_fallbacks_then_recovery(pool):
    restarts = worker_restarts(pool)
    os.kill(pid_of(pool, "model"), signal.SIGKILL)
    # Until it is back: answered at once, the reason says why, health says so.
    wait_for(lambda: not pool.router_serving(), 10, "workers report NOT_SERVING")
    reasons, guessed = set(), 0
    for _ in range(10):
        r = ask(pool, UNSURE)
        assert r.status_code == 200
        reasons.add(r.headers["x-semantic-route-reason"])
        if r.headers["x-semantic-route-reason"] == "fallback_unavailable":
            assert r.headers["x-mock-backend"] == "general-model"
        # The static tier's guess routes a prompt it leans on, and the reason still says why.
        lean = ask(pool, LEANING)
        if lean.headers["x-semantic-route-reason"] == "fallback_unavailable":
            assert (lean.headers["x-mock-backend"], lean.headers["x-semantic-route-tier"]) == ("math-model", "static")
            guessed += 1
    assert "fallback_unavailable" in reasons and guessed
    # What a worker's static tier is sure of is still routed without the model.
    sure = ask(pool, "solve 2x + 3 = 7")
    assert (sure.headers["x-mock-backend"], sure.headers["x-semantic-route-tier"]) == ("math-model", "static")
    wait_for(lambda: ask(pool, UNSURE).headers["x-semantic-route-reason"] == "default",
             240, "routing again once the model process is back")
    assert metric(scrape(pool.metrics_url), "semantic_router_pool_restarts_total", 'process="model"') == 1
    wait_for(pool.router_serving, 10, "workers report SERVING again")
    # Every worker lived through it, on its config: the answers above may all have come from one.
    assert worker_restarts(pool) == restarts
    wait_for(lambda: set(served_versions(pool)) >= set(WORKERS), 30, "every worker reports its config")


def served_versions(stack) -> dict[str, set[str]]:
    """process -> the config versions it reports serving (semantic_router_config_version == 1)."""
    import re
    out: dict[str, set[str]] = {}
    for line in scrape(stack.metrics_url).splitlines():
        if line.startswith("semantic_router_config_version{") and line.endswith(" 1.0"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out.setdefault(labels["process"], set()).add(labels["version"])
    return out


def test_a_reload_under_load_ends_every_worker_on_the_same_config(pool):
    before = served_versions(pool)
    assert set(before) >= {"worker-0", "worker-1"} and len(set.union(*before.values())) == 1
    path = pool.router_config
    config = yaml.safe_load(path.read_text())
    config["routes"].append({"name": "geography", "model": "general-model",
                             "utterances": ["what is the capital of France", "which river is the longest"]})
    reasons: list[str | None] = []

    def load(n: int):
        for i in range(n):
            reasons.append(route_once(pool.ports.router_grpc, f"solve the equation {i}x + 3 = 11").get(
                "x-semantic-route-reason"))

    with ThreadPoolExecutor(4) as threads:
        running = [threads.submit(load, 40) for _ in range(4)]
        time.sleep(0.5)
        path.write_text(yaml.safe_dump(config))
        os.kill(pool.router.pid, signal.SIGHUP)  # the pool forwards it to every worker
        for r in running:
            r.result(timeout=300)
    wait_for(lambda: all(served_versions(pool).get(w, {None}) - set.union(*before.values())
                         for w in ("worker-0", "worker-1")), 120, "every worker on the new config")
    after = served_versions(pool)
    assert after["worker-0"] - before["worker-0"] == after["worker-1"] - before["worker-1"]  # the same one
    assert set(reasons) == {"matched"}, {r: reasons.count(r) for r in set(reasons)}  # no request refused for it
