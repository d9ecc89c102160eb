"""The best p99 any natural-batching scheduler could reach with this model on this machine.

    python -m bench.batcher.latency_bound [--device cpu|cuda] [--out result.json]

Measures what a batch of n short prompts costs on a model thread, then simulates Poisson arrivals
at 50/80/95% of the batch-64 ceiling against an ideal batcher: zero hand-off, tokenization or
event-loop cost, next batch = everything queued when the model frees (up to a cap). The gap between
this and `bench.batcher.batcher_bench` is the batcher's own overhead; the gap between this and "3 x one
request alone" is the hardware's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time

import numpy as np

from bench.report import emit, latency_stats
from bench.workloads import short_prompts
from esr_config import EncoderConfig
from esr_model.encoder import SentenceEncoder
from esr_model.torch_threads import on_own_thread

SIZES = (1, 2, 4, 8, 16, 32, 64)


def batch_costs_ms(enc: SentenceEncoder, repeats: int = 15) -> dict[int, float]:
    """Median forward time of a batch of n short prompts, per n (on the calling thread)."""
    enc.warmup()  # also sets this thread's torch thread count
    ids = enc.tokenize(short_prompts(64))
    costs = {}
    for n in SIZES:
        times = []
        for r in range(repeats):
            batch = (ids[r:] + ids[:r])[:n]  # different prompts each time, same size
            t0 = time.perf_counter()
            enc.embed(batch)
            times.append((time.perf_counter() - t0) * 1000)
        costs[n] = statistics.median(times)
    return costs


def simulate(costs: dict[int, float], rate_per_s: float, cap: int, seconds: float = 600.0, seed: int = 1) -> dict:
    """Latency percentiles (ms) of an ideal natural batcher under Poisson arrivals."""
    sizes = sorted(costs)
    size_costs = [costs[s] for s in sizes]

    def cost(n: int) -> float:
        return float(np.interp(n, sizes, size_costs))

    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while t < seconds * 1000:
        t += rng.expovariate(rate_per_s / 1000)
        arrivals.append(t)
    latencies, batch_sizes = [], []
    free, i, queued = 0.0, 0, []
    while i < len(arrivals) or queued:
        if not queued:
            free = max(free, arrivals[i])
        while i < len(arrivals) and arrivals[i] <= free:
            queued.append(arrivals[i])
            i += 1
        batch, queued = queued[:cap], queued[cap:]
        free += cost(len(batch))
        latencies += [free - a for a in batch]
        batch_sizes.append(len(batch))
    return {**latency_stats([ms / 1000.0 for ms in latencies]), "mean_batch": round(float(np.mean(batch_sizes)), 2)}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.batcher.latency_bound")
    p.add_argument("--device", default="auto")
    p.add_argument("--cpu-bf16", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    enc = SentenceEncoder(EncoderConfig(device=args.device, cpu_bf16=args.cpu_bf16))
    costs = asyncio.run(on_own_thread(batch_costs_ms, enc))  # a thread that exits: see esr_model/torch_threads.py
    ceiling = 64 / costs[64] * 1000
    rows = [{"workload": "short", "scenario": f"cost_of_batch_{n}", "p50_ms": round(ms, 2), "mean_batch": n}
            for n, ms in costs.items()]
    checks = {}
    # Every load uncapped; at 50% also smaller caps, to show that trading batch size for
    # batch time does not help either (above 50% small caps cannot keep up at all).
    for load, cap in ((0.5, 64), (0.5, 16), (0.5, 8), (0.5, 4), (0.8, 64), (0.95, 64)):
        res = simulate(costs, load * ceiling, cap)
        rows.append({"workload": "short", "scenario": f"ideal_poisson_{int(load * 100)}pct_cap{cap}", **res})
        if load == 0.5 and cap == 64:
            ratio = res["p99_ms"] / costs[1]
            checks["short: ideal batcher p99 at 50% load <= 3 x single-request latency"] = {
                "ok": ratio <= 3, "detail": f"{res['p99_ms']:.1f} ms vs single {costs[1]:.1f} ms ({ratio:.2f}x)"}
    emit({"benchmark": "latency_bound", "device": enc.device, "cpu_count": os.cpu_count(),
          "ceiling_rps": round(ceiling, 1), "rows": rows, "checks": checks}, args.out)


if __name__ == "__main__":
    main()
