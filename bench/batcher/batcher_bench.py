"""Batcher benchmark: the model's ceiling vs a naive unbatched server vs the continuous batcher.

    python -m bench.batcher.batcher_bench [--device cpu|cuda] [--scale 1.0] [--out result.json]

All figures come from one run on one machine, so compare them as ratios. The throughputs the
targets compare (ceiling, unbatched c64, batcher c64) are each the median of --repeats interleaved
trials; the JSON keeps every trial.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import time
from concurrent.futures import ThreadPoolExecutor

from batching import BatcherSettings, ContinuousBatcher
from bench.report import emit, latency_stats
from bench.workloads import WORKLOADS
from bench.harness import closed_loop, median_row, open_loop
from esr_config import EncoderConfig
from esr_model.encoder import SentenceEncoder
from esr_model.torch_threads import on_own_thread

FAR = 3600.0


class BatchStats:
    """Batcher observer that keeps what the report needs."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.sizes, self.tokens, self.padded = [], 0, 0

    def on_batch(self, size, tokens, padded_tokens, inference_s, queue_waits_s):
        self.sizes.append(size)
        self.tokens += tokens
        self.padded += padded_tokens

    def on_dropped(self, reason, count):
        pass

    def on_queue_depth(self, requests, tokens):
        pass

    def on_tokenized(self, by, count):
        pass

    def summary(self) -> dict:
        return {
            "mean_batch": round(sum(self.sizes) / len(self.sizes), 2) if self.sizes else None,
            "padding": round(1 - self.tokens / self.padded, 3) if self.padded else None,
            "batches": len(self.sizes),
        }


def ceiling(enc: SentenceEncoder, texts: list[str], batch: int) -> float:
    """Offline encode at the max batch size, sorted by length: the model's best case (req/s)."""
    enc.prepare_thread()
    ordered = sorted(texts, key=len)
    t0 = time.perf_counter()
    for i in range(0, len(ordered), batch):
        enc.embed(enc.tokenize(ordered[i : i + batch]))
    return len(texts) / (time.perf_counter() - t0)


def single_latency(enc: SentenceEncoder, texts: list[str], n: int = 100) -> dict:
    enc.prepare_thread()
    lat = []
    for t in texts[:n]:
        t0 = time.perf_counter()
        enc.embed(enc.tokenize([t]))
        lat.append(time.perf_counter() - t0)
    return latency_stats(lat)


async def run_workload(
    enc: SentenceEncoder, name: str, scale: float, settings: BatcherSettings, repeats: int
) -> tuple[list, dict]:
    n = max(64, int((2048 if name == "short" else 512) * scale))
    texts = WORKLOADS[name](n)
    loop = asyncio.get_running_loop()

    def offline_ceiling():
        ceiling(enc, texts[: settings.max_batch_size * 2], settings.max_batch_size)  # warm caches
        return ceiling(enc, texts, settings.max_batch_size)

    async def unbatched():
        with ThreadPoolExecutor() as pool:  # what a naive server does: one encode per request, in threads
            return await closed_loop(
                lambda t: loop.run_in_executor(pool, lambda: enc.embed(enc.tokenize([t]))), texts, 64, n // 2)

    # The three throughputs the targets compare are measured `repeats` times, interleaved, so a
    # noisy moment on a shared machine hits one trial rather than one side of a ratio. Each runs
    # with no other torch thread pool alive (a batcher's included: see esr_model/torch_threads.py).
    trials: dict[str, list] = {"ceiling": [], "unbatched_c64": [], "batcher_c64": []}
    for _ in range(repeats):
        trials["ceiling"].append({"throughput_rps": round(await on_own_thread(offline_ceiling), 1)})
        trials["unbatched_c64"].append(await unbatched())
        async with running_batcher(enc, settings) as (submit, stats):
            trials["batcher_c64"].append({**await closed_loop(submit, texts, 64, n), **stats.summary()})
    ceil = median_row(trials["ceiling"])
    naive = median_row(trials["unbatched_c64"])
    c64_row = median_row(trials["batcher_c64"])

    single = await on_own_thread(single_latency, enc, texts)
    rows = [{"workload": name, "scenario": "ceiling", **ceil},
            {"workload": name, "scenario": "single_request", **single},
            {"workload": name, "scenario": "unbatched_c64", **naive}]
    closed = {64: c64_row}
    async with running_batcher(enc, settings) as (submit, stats):
        for c in (1, 8, 256):
            stats.reset()
            total = min(n, max(64, 16 * c)) if c == 1 else n
            closed[c] = {**await closed_loop(submit, texts, c, total), **stats.summary()}
        rows += [{"workload": name, "scenario": f"batcher_c{c}", **closed[c]} for c in sorted(closed)]
        duration = max(3.0, 6.0 * scale)
        for load in (0.5, 0.8, 0.95):
            stats.reset()
            res = await open_loop(submit, texts, load * ceil["throughput_rps"], duration)
            rows.append({"workload": name, "scenario": f"poisson_{int(load * 100)}pct", **res, **stats.summary()})

    by = {r["scenario"]: r for r in rows}
    ceil_rps, naive_rps, c64 = ceil["throughput_rps"], naive["throughput_rps"], c64_row["throughput_rps"]
    p99 = by["poisson_50pct"]["p99_ms"]
    checks = {
        f"{name}: batcher c64 >= 0.9 x ceiling": {
            "ok": c64 >= 0.9 * ceil_rps, "detail": f"{c64:.1f} vs {ceil_rps:.1f} req/s ({c64 / ceil_rps:.2f}x)"},
        f"{name}: batcher c64 >= 1.5 x unbatched": {
            "ok": c64 >= 1.5 * naive_rps, "detail": f"{c64:.1f} vs {naive_rps:.1f} req/s ({c64 / naive_rps:.2f}x)"},
        f"{name}: p99 at 50% load <= 3 x single-request latency": {
            "ok": p99 <= 3 * single["p50_ms"],
            "detail": f"{p99:.1f} ms vs single {single['p50_ms']:.1f} ms ({p99 / single['p50_ms']:.2f}x)"},
    }
    return rows, checks


@contextlib.asynccontextmanager
async def running_batcher(enc: SentenceEncoder, settings: BatcherSettings):
    """A started, warmed batcher and its stats, closed on exit (which frees its model thread's pool)."""
    stats = BatchStats()
    batcher = ContinuousBatcher(enc, settings, stats)
    batcher.start()
    await batcher.started()
    gc.collect()
    gc.freeze()  # as the server does once it is up (esr_app/server.py)
    try:
        yield (lambda text: batcher.embed(text, time.monotonic() + FAR)), stats
    finally:
        await batcher.aclose()


async def main_async(args) -> dict:
    enc = SentenceEncoder(EncoderConfig(device=args.device, cpu_bf16=args.cpu_bf16))
    await on_own_thread(enc.warmup)  # not on this thread: see esr_model/torch_threads.py
    settings = BatcherSettings(max_batch_size=args.max_batch_size, max_batch_tokens=args.max_batch_tokens)
    rows, checks = [], {}
    for name in args.workloads:
        r, c = await run_workload(enc, name, args.scale, settings, args.repeats)
        rows += r
        checks.update(c)
    return {
        "benchmark": "batcher",
        "device": enc.device,
        "cpu_bf16": enc.cpu_bf16,
        "cpu_count": os.cpu_count(),
        "max_batch_size": settings.max_batch_size,
        "max_batch_tokens": settings.max_batch_tokens,
        "rows": rows,
        "checks": checks,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.batcher.batcher_bench")
    p.add_argument("--device", default="auto")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies request counts and durations")
    p.add_argument("--workloads", nargs="+", default=["short", "mixed"], choices=sorted(WORKLOADS))
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-batch-tokens", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=3, help="interleaved trials of the throughputs the targets compare")
    p.add_argument("--cpu-bf16", action="store_true", help="bf16 autocast on CPU (encoder.cpu_bf16)")
    p.add_argument("--out")
    args = p.parse_args()
    emit(asyncio.run(main_async(args)), args.out)


if __name__ == "__main__":
    main()
