"""The router on its own model vs on a remote Infinity (same machine, same prompts), and the share of
the engine's own ceiling the router reaches.

    python -m bench.batcher.remote_bench [--seconds 6] [--trials 2] [--in-flight 1 2 4 8] [--engine-cpus 1] [--out F]

Rows: the engine alone (batches of 64 posted straight to it: its ceiling), then routed req/s with
p50/p99 at c1/c8/c64 for both routers (trials interleaved), the remote router's mean inputs per
call, and a sweep of encoder.remote.max_in_flight at c64. `--engine-cpus N` pins Infinity to the
last N cores and the router and load generator to the others, as if the engine had a machine of
its own; without it everything shares every core. Needs `make infinity`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import closed_loop
from bench.harness import ExtProcClient, start_router
from bench.harness import scrape
from bench.report import emit
from bench.workloads import short_prompts
from devstack.infinity import SERVED_NAME, Infinity
from devstack.stack import free_port
from esr_remote.embeddings_api import EmbeddingsAPI

CONCURRENCY = (1, 8, 64)


def engine_ceiling(url: str, texts: list[str], seconds: float, clients: int, batch: int = 64) -> float:
    """Embeddings/s with `clients` threads each posting `batch` prompts at a time, straight to the engine."""
    api = EmbeddingsAPI(url, SERVED_NAME)
    done, stop = [0] * clients, time.monotonic() + seconds

    def client(i: int) -> None:
        k = i * batch
        while time.monotonic() < stop:
            api.embed([texts[(k + j) % len(texts)] for j in range(batch)], 30.0)
            done[i] += batch
            k += batch * clients

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.monotonic() - t0)


async def routed(port: int, metrics_port: int, texts: list[str], concurrency: int, seconds: float) -> dict:
    client = ExtProcClient(port)
    before = scrape(metrics_port)
    # Closed loop for about `seconds`: sized by a short probe of the rate.
    probe = await closed_loop(client.route, texts, concurrency, max(concurrency, 16))
    total = max(concurrency * 4, int(probe["throughput_rps"] * seconds))
    res = await closed_loop(client.route, texts, concurrency, total)
    after = scrape(metrics_port)
    await client.channel.close()
    size = after.get("semantic_router_batch_size_sum", 0) - before.get("semantic_router_batch_size_sum", 0)
    batches = after.get("semantic_router_batch_size_count", 0) - before.get("semantic_router_batch_size_count", 0)
    return {**res, "mean_batch": round(size / batches, 1) if batches else None, "reasons": dict(client.reasons)}


def pin(pid: int, cpus: set[int]) -> None:
    for task in os.listdir(f"/proc/{pid}/task"):  # every thread: affinity is per thread
        try:
            os.sched_setaffinity(int(task), cpus)
        except OSError:
            pass


async def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    cpus = sorted(os.sched_getaffinity(0))
    engine_cpus = set(cpus[-args.engine_cpus:]) if args.engine_cpus else set(cpus)
    router_cpus = set(cpus) - engine_cpus if args.engine_cpus else set(cpus)
    engine = Infinity(free_port(), workdir, batch_size=64).start()
    routers: dict[str, tuple] = {}
    rows: list[dict] = []
    try:
        if args.engine_cpus:
            pin(engine.proc.pid, engine_cpus)
            os.sched_setaffinity(0, router_cpus)  # the load generator, and the routers it starts
        texts = short_prompts(4096, seed=5)
        remote = {"url": engine.url, "model": SERVED_NAME, "max_batch": 64}
        for name, encoder in [("local", {}), *[(f"remote_inflight{n}", {"remote": {**remote, "max_in_flight": n}})
                                              for n in args.in_flight]]:
            metrics_port = free_port()
            (workdir / name).mkdir()
            proc, port = start_router(workdir / name, "cpu", None, encoder=encoder, metrics_port=metrics_port)
            routers[name] = (proc, port, metrics_port)
            warm = ExtProcClient(port)
            await closed_loop(warm.route, texts[:256], 16, 256)  # first batches, the cost model
            await warm.channel.close()
        ceilings = []
        main_remote = f"remote_inflight{args.main_in_flight}"
        for trial in range(args.trials):
            for clients in (1, 2, 4):
                ceilings.append(engine_ceiling(engine.url, texts, args.seconds, clients))
                rows.append({"workload": "short", "scenario": f"engine_alone_{clients}x64", "trial": trial,
                             "throughput_rps": round(ceilings[-1], 1)})
            for c in CONCURRENCY:
                for name in ("local", main_remote):
                    _, port, metrics_port = routers[name]
                    res = await routed(port, metrics_port, texts, c, args.seconds)
                    rows.append({"workload": "short", "scenario": f"{name}_c{c}", "trial": trial, **res})
            for n in args.in_flight:
                if f"remote_inflight{n}" != main_remote:
                    _, port, metrics_port = routers[f"remote_inflight{n}"]
                    res = await routed(port, metrics_port, texts, 64, args.seconds)
                    rows.append({"workload": "short", "scenario": f"remote_inflight{n}_c64", "trial": trial, **res})
    finally:
        for proc, _, _ in routers.values():
            proc.terminate()
            proc.wait(30)
        engine.stop()
    return summarize(rows, max(ceilings) if ceilings else 0.0, args, engine_cpus, router_cpus)


def summarize(rows: list[dict], ceiling: float, args, engine_cpus: set[int], router_cpus: set[int]) -> dict:
    best: dict[str, dict] = {}
    for r in rows:  # best trial per scenario: the machine is shared and noisy
        if r["scenario"] not in best or r["throughput_rps"] > best[r["scenario"]]["throughput_rps"]:
            best[r["scenario"]] = r
    share = {s: round(r["throughput_rps"] / ceiling, 3) for s, r in best.items() if s.startswith("remote") and ceiling}
    main = f"remote_inflight{args.main_in_flight}_c64"
    return {
        "benchmark": "remote_engine", "cpu_count": os.cpu_count(), "engine_cpus": sorted(engine_cpus),
        "router_cpus": sorted(router_cpus), "engine_ceiling_embeddings_per_s": round(ceiling, 1),
        "share_of_ceiling": share, "rows": list(best.values()),
        "checks": {"remote_c64_reaches_0.8x_engine_ceiling": {
            "ok": share.get(main, 0) >= 0.8,
            "detail": f"{best[main]['throughput_rps'] if main in best else 0} routed req/s vs ceiling "
                      f"{ceiling:.0f} embeddings/s = {share.get(main, 0):.2f}x"}},
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.batcher.remote_bench")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--main-in-flight", type=int, default=4, help="the max_in_flight of the c1/c8/c64 rows")
    p.add_argument("--engine-cpus", type=int, default=0, help="pin Infinity to this many cores (0: share all)")
    p.add_argument("--out")
    args = p.parse_args()
    if args.main_in_flight not in args.in_flight:
        p.error("--main-in-flight must be one of --in-flight")
    emit(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
