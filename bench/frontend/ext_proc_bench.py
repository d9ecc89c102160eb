"""The same load through the full ext_proc path: a real router process, gRPC streams opened the way
Envoy opens them (headers message, then the buffered body), the filter chain, the batcher.

    python -m bench.frontend.ext_proc_bench [--scale 1.0] [--out result.json]

The load generator is Python on the same machine, so on 2 cores it competes with the router:
read the figures as a lower bound on what the router holds behind Envoy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

from bench.harness import closed_loop, open_loop
from bench.harness import ExtProcClient, start_router
from bench.report import emit
from bench.workloads import WORKLOADS

async def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-ext-proc-"))
    proc, port = start_router(workdir, args.device, args.cpu_threads)
    rows = []
    try:
        client = ExtProcClient(port)
        n_warm = WORKLOADS["short"](64, seed=99)
        await closed_loop(client.route, n_warm, 16, 64)
        pinned = WORKLOADS["short"](512, seed=98)
        res = await closed_loop(lambda t: client.route(t, model="code-model"), pinned, 64, int(2000 * args.scale))
        rows.append({"workload": "pinned", "scenario": "ext_proc_c64_no_model", **res})
        for name in args.workloads:
            n = max(64, int((2048 if name == "short" else 512) * args.scale))
            texts = WORKLOADS[name](n, seed=11)
            peak = 0.0
            for c in (1, 8, 64, 256):
                total = min(n, max(64, 16 * c)) if c == 1 else n
                client.reasons.clear()
                res = await closed_loop(client.route, texts, c, total)
                rows.append({"workload": name, "scenario": f"ext_proc_c{c}", **res, "reasons": dict(client.reasons)})
                peak = max(peak, res["throughput_rps"])
            # Load as a share of what this path itself holds (the model's ceiling is out of reach
            # here: the Python client shares the cores), plus an optional fixed rate.
            rates = [(f"ext_proc_poisson_{int(f * 100)}pct", f * peak) for f in (0.5, 0.8, 0.95)]
            if args.rate.get(name):
                rates.append(("ext_proc_poisson", args.rate[name]))
            for scenario, rate in rates:
                client.reasons.clear()
                res = await open_loop(client.route, texts, rate, max(3.0, 6.0 * args.scale))
                rows.append({"workload": name, "scenario": scenario, **res, "reasons": dict(client.reasons)})
        await client.channel.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return {"benchmark": "ext_proc", "cpu_count": os.cpu_count(), "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend.ext_proc_bench")
    p.add_argument("--device", default="auto")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--cpu-threads", type=int, help="override encoder.cpu_threads")
    p.add_argument("--workloads", nargs="+", default=["short", "mixed"], choices=sorted(WORKLOADS))
    p.add_argument("--poisson-short", type=float, default=0.0, help="offered req/s for an open-loop run (0: skip)")
    p.add_argument("--poisson-mixed", type=float, default=0.0)
    p.add_argument("--out")
    args = p.parse_args()
    args.rate = {"short": args.poisson_short, "mixed": args.poisson_mixed}
    emit(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
