"""Does the router keep routing when it shares the CPUs? Bursts of unique short prompts through the
ext_proc interface of a real router process, with the default 500 ms deadline:

  neighbour  CPU-bound processes beside the router, against the router alone: one pinned to a core
             (`pinned`), and one or two the scheduler moves freely (`unpinned1`, `unpinned2`: a node
             without CPU pinning; pinning hides the stalls a descheduled model thread causes)
  quota      the router inside a 1-CPU CFS quota (cgroup v1 `cpu`), default thread policy against
             hand-tuned `encoder.cpu_threads`

    python -m bench.overload.contention_bench [--scenarios neighbour quota] [--neighbours pinned unpinned1 unpinned2]
                                     [--backend auto|onnx|torch] [--precision auto|fp32|int8] [--trials 2]
                                     [--cascade] [--out result.json]

Trials are interleaved (alone / contended, policy after policy) and every figure of a comparison
comes from the same run. The quota scenario needs root and the cgroup v1 `cpu` controller at
/sys/fs/cgroup/cpu. The overload scenario through Envoy is `bench.overload.overload_bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

from bench.harness import closed_loop, median_row
from bench.harness import ExtProcClient, start_router
from bench.report import emit
from bench.workloads import short_prompts
from bench.harness import NEIGHBOURS, cpu_quota, neighbour

ENCODER: dict = {}  # encoder settings every router of the run gets (--backend, --torchscript)
SERVING = {"cascade": False}  # --cascade: every router of the run serves the default config's static tier
FALLBACKS = ("fallback_timeout", "fallback_overload", "fallback_error", "fallback_shutdown")


async def bursts(client: ExtProcClient, seed: int, n_bursts: int, size: int, concurrency: int) -> dict:
    """`n_bursts` bursts of `size` unique prompts at `concurrency`: req/s over all and outcomes."""
    client.reasons.clear()
    elapsed, latencies = 0.0, []
    for b in range(n_bursts):
        texts = [f"{t} #{seed}-{b}-{i}" for i, t in enumerate(short_prompts(size, seed=seed * 100 + b))]
        t0 = time.perf_counter()
        res = await closed_loop(client.route, texts, concurrency, size)
        elapsed += time.perf_counter() - t0
        latencies.append(res["p99_ms"])
    total = sum(client.reasons.values())
    fallbacks = sum(client.reasons.get(r, 0) for r in FALLBACKS)
    return {
        "throughput_rps": round(total / elapsed, 1),
        "p99_ms": max(latencies),
        "fallback_share": round(fallbacks / total, 4) if total else None,
        "reasons": dict(client.reasons),
    }


@contextlib.asynccontextmanager
async def router(workdir: Path, cpu_threads: int | None, cgroup: Path | None = None):
    proc, port = start_router(workdir, "cpu", cpu_threads, deadline_ms=500, cgroup=cgroup, encoder=ENCODER,
                              cascade=SERVING["cascade"])
    client = ExtProcClient(port)
    try:
        await bursts(client, seed=999, n_bursts=1, size=64, concurrency=16)  # warm-up
        yield client
    finally:
        await client.channel.close()
        proc.terminate()
        proc.wait(30)


def _label(threads: int | None) -> str:
    return "default" if threads is None else f"cpu_threads={threads}"


def _median(rows: list[dict]) -> dict:
    return {**median_row(rows), "worst_fallback_share": max(r["fallback_share"] or 0 for r in rows)}


async def scenario_neighbour(args, workdir: Path) -> tuple[list[dict], dict]:
    rows, checks = [], {}
    for threads in args.policies:
        alone: list[dict] = []
        busy: dict[str, list[dict]] = {kind: [] for kind in args.neighbours}
        async with router(workdir, threads) as client:
            for t in range(args.trials):
                alone.append(await bursts(client, 10 + t, args.bursts, args.size, args.concurrency))
                for i, kind in enumerate(args.neighbours):
                    with neighbour(kind):
                        busy[kind].append(await bursts(client, 20 + 10 * i + t, args.bursts, args.size, args.concurrency))
        a = _median(alone)
        rows.append({"workload": _label(threads), "scenario": f"alone_c{args.concurrency}", **a})
        for kind, results in busy.items():
            b = _median(results)
            rows.append({"workload": _label(threads), "scenario": f"{kind}_c{args.concurrency}", **b})
            if threads is None:
                ratio = b["throughput_rps"] / a["throughput_rps"]
                checks[f"{kind} neighbour(s): <= 1% fallbacks, throughput >= 0.6 x alone"] = {
                    "ok": b["worst_fallback_share"] <= 0.01 and ratio >= 0.6,
                    "detail": f"fallbacks {b['worst_fallback_share']:.1%} (worst trial), "
                              f"{b['throughput_rps']} vs {a['throughput_rps']} req/s ({ratio:.2f}x)",
                }
    return rows, checks


async def scenario_quota(args, workdir: Path) -> tuple[list[dict], dict]:
    rows, checks = [], {}
    results: dict[int | None, list[dict]] = {t: [] for t in args.policies}
    with cpu_quota(args.quota) as group:
        for t in range(args.trials):  # policy after policy, trial after trial: interleaved
            for threads in args.policies:
                async with router(workdir, threads, cgroup=group) as client:
                    results[threads].append(await bursts(client, 30 + t, args.bursts, args.size, args.concurrency))
    medians = {t: _median(r) for t, r in results.items()}
    for threads, row in medians.items():
        rows.append({"workload": _label(threads), "scenario": f"quota_{args.quota:g}cpu_c32", **row})
    if None in medians:
        tuned = max((r for t, r in medians.items() if t is not None), key=lambda r: r["throughput_rps"], default=None)
        d = medians[None]
        if tuned is not None:
            ratio = d["throughput_rps"] / tuned["throughput_rps"]
            checks[f"{args.quota:g}-CPU quota: <= 1% fallbacks, throughput >= 0.9 x best hand-tuned"] = {
                "ok": d["worst_fallback_share"] <= 0.01 and ratio >= 0.9,
                "detail": f"fallbacks {d['worst_fallback_share']:.1%} (worst trial), {d['throughput_rps']} vs "
                          f"{tuned['throughput_rps']} req/s ({ratio:.2f}x)",
            }
    return rows, checks


SCENARIOS = {"neighbour": scenario_neighbour, "quota": scenario_quota}


async def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-contention-"))
    rows, checks = [], {}
    for name in args.scenarios:
        r, c = await SCENARIOS[name](args, workdir)
        rows += r
        checks.update(c)
    return {"benchmark": "contention", "cpu_count": os.cpu_count(), "rows": rows, "checks": checks}


def _policy(text: str) -> int | None:
    return None if text == "default" else int(text)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.overload.contention_bench")
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--policies", nargs="+", type=_policy, default=[None, 1, 2],
                   help="'default' (the router's own thread policy) and/or cpu_threads values")
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--bursts", type=int, default=3)
    p.add_argument("--size", type=int, default=96, help="unique prompts per burst")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--quota", type=float, default=1.0, help="CPUs of CFS quota in the quota scenario")
    p.add_argument("--out")
    p.add_argument("--neighbours", nargs="+", choices=list(NEIGHBOURS), default=list(NEIGHBOURS))
    p.add_argument("--backend", choices=["auto", "onnx", "torch"], default="auto", help="encoder.backend")
    p.add_argument("--precision", choices=["auto", "fp32", "int8"], default="auto", help="encoder.precision (onnx)")
    p.add_argument("--torchscript", choices=["on", "off"], default="on", help="encoder.torchscript (torch)")
    p.add_argument("--cascade", action="store_true", help="serve router.yaml's static tier (default: the encoder alone)")
    args = p.parse_args()
    SERVING["cascade"] = args.cascade
    ENCODER.update(backend=args.backend, torchscript=args.torchscript == "on")
    if args.backend != "torch":
        ENCODER["precision"] = args.precision
    emit(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
