"""The response cache through Envoy: what a hit costs, and what the cache costs the misses.

    python -m bench.cache.cache_bench [--seconds 8] [--trials 3] [--concurrency 16] [--out build/bench-cache.json]

Two stacks (router.yaml, mock backends, Envoy), one with `cache.enabled`, one without:
  hit      -- the same request, one client after another, answered by the gateway
  miss     -- a new prompt each time, one client after another (the cache looks up, asks Envoy for
              the response, keeps it)
  routed   -- req/s of new prompts at --concurrency, cache on vs off, trials interleaved
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench.closed_loop import closed_loop_rps
from bench.report import emit, latency_stats
from devstack.stack import stack_with

PROMPTS = ("solve the equation 2x + 3 = 11", "write a python function that sorts a list", "tell me a joke")


def _body(prompt: str) -> dict:
    return {"model": "auto", "messages": [{"role": "user", "content": prompt}], "temperature": 0}


def sequential(url: str, prompts: list[str]) -> dict:
    latencies, hits = [], 0
    with httpx.Client(base_url=url, timeout=30) as http:
        for prompt in prompts:
            t0 = time.perf_counter()
            r = http.post("/v1/chat/completions", json=_body(prompt))
            latencies.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
            hits += r.headers.get("x-semantic-cache") == "hit"
    return {**latency_stats(latencies), "hits": hits, "requests": len(prompts)}


def routed_rps(url: str, seconds: float, concurrency: int) -> float:
    sent = itertools.count()

    def one(http: httpx.Client) -> bool:
        r = http.post("/v1/chat/completions", json=_body(f"{PROMPTS[next(sent) % 3]} {uuid.uuid4().hex}"))
        return r.status_code == 200 and r.headers.get("x-semantic-route-reason") == "matched"

    return closed_loop_rps(url, seconds, concurrency, one)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cache.cache_bench")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=300, help="sequential requests for the hit and miss latencies")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    def on(config):
        config["cache"] = {"enabled": True}

    def off(config):
        pass

    with stack_with(Path(tempfile.mkdtemp(prefix="bench-cache-on-")), on) as cached, \
            stack_with(Path(tempfile.mkdtemp(prefix="bench-cache-off-")), off) as plain:
        # Both routers just started (their parser processes, the thread tuner, first-call paths):
        # warmed with routed traffic first, so that start-up does not count as the cache's cost.
        for url in (cached.url, plain.url):
            sequential(url, [f"{PROMPTS[i % 3]} warm-up {i}" for i in range(100)])
        sequential(cached.url, [PROMPTS[0]] * 20)  # the entry every hit below replays, and its first hits
        hit = sequential(cached.url, [PROMPTS[0]] * args.requests)
        miss = sequential(cached.url, [f"{PROMPTS[0]} {uuid.uuid4().hex}" for _ in range(args.requests)])
        uncached = sequential(plain.url, [f"{PROMPTS[0]} {uuid.uuid4().hex}" for _ in range(args.requests)])
        trials: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(args.trials):  # interleaved: the machine's noise falls on both alike
            trials["on"].append(round(routed_rps(cached.url, args.seconds, args.concurrency), 1))
            trials["off"].append(round(routed_rps(plain.url, args.seconds, args.concurrency), 1))
    median = {k: sorted(v)[len(v) // 2] for k, v in trials.items()}
    rows = [
        {"workload": "sequential", "scenario": "hit (cache on)", **hit},
        {"workload": "sequential", "scenario": "miss (cache on)", **miss},
        {"workload": "sequential", "scenario": "routed (cache off)", **uncached},
        {"workload": f"c{args.concurrency}", "scenario": "routed, all misses (cache on)", "throughput_rps": median["on"]},
        {"workload": f"c{args.concurrency}", "scenario": "routed (cache off)", "throughput_rps": median["off"]},
    ]
    checks = {
        "hit p50 <= 5 ms": {"ok": hit["p50_ms"] <= 5.0, "detail": f"{hit['p50_ms']} ms"},
        "routed req/s, cache on (all misses) >= 0.9 x off": {
            "ok": median["on"] >= 0.9 * median["off"],
            "detail": f"{median['on']} vs {median['off']} req/s ({median['on'] / median['off']:.2f}x); trials {trials}"},
    }
    emit({"rows": rows, "checks": checks, "trials": trials}, args.out,
         columns=("workload", "scenario", "throughput_rps", "p50_ms", "p95_ms", "p99_ms", "hits", "requests"))


if __name__ == "__main__":
    main()
