"""The router's front end through the real Envoy: CPU per request and how it scales with workers.

    python -m bench.frontend.frontend_bench [--workers 1 2 4] [--seconds 8] [--trials 2] [--out result.json]

Each worker count gets its own router (a pool on encoder.socket, fed by one stub model process of
fixed cost, bench/stub_model.py) behind its own Envoy whose routes answer directly; `inprocess`
is the one-process router with the real model loaded (today's default). Two paths, by wrk at
c64: `pinned` (the body names a backend model: no embedding) and `full` (model "auto", unique
prompts: embedded through the batcher). Trials interleave every router and path.

CPU per request is read from /proc (user + system of the router's whole process tree and of
Envoy) over each run, divided by the requests answered: steadier than throughput on a shared
machine, where wrk, Envoy and the router share the same cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


from bench.harness import run_wrk, wrk_workdir
from bench.report import emit
from bench.harness import Gateway, PINNED_SCRIPT
from devstack.stack import ROOT


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend.frontend_bench")
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--no-inprocess", action="store_true", help="skip the one-process router with the real model")
    p.add_argument("--batch-ms", type=float, default=2.0, help="the stub model's fixed cost per batch")
    p.add_argument("--out")
    args = p.parse_args()
    workdir = wrk_workdir("frontend")
    scripts = {"pinned": workdir / "pinned.lua", "full": workdir / "full.lua"}
    from bench.harness import WRK_SCRIPT

    scripts["pinned"].write_text(PINNED_SCRIPT + WRK_SCRIPT[WRK_SCRIPT.index("function response"):])
    scripts["full"].write_text(WRK_SCRIPT)
    sock = str(workdir / "model.sock")
    model = subprocess.Popen([sys.executable, "-m", "bench.stub_model", "--socket", sock, "--batch-ms", str(args.batch_ms)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    for line in model.stdout:
        if line.startswith("model ready"):
            break
    gateways: list[Gateway] = []
    rows: list[dict] = []
    try:
        if not args.no_inprocess:
            gateways.append(Gateway("inprocess", workdir, 1, None))
        for n in args.workers:
            gateways.append(Gateway(f"pool_w{n}", workdir, n, sock))
        for g in gateways:  # warm-up
            run_wrk(g.listener, 16, 2, scripts["pinned"])
        for _ in range(args.trials):
            for g in gateways:
                for path in ("pinned", "full"):
                    if g.name == "inprocess" and path == "full":
                        continue  # the real model on this CPU, not the front end, would be measured
                    rows.append(g.measure(path, scripts[path], args.seconds))
    finally:
        for g in gateways:
            g.close()
        model.terminate()
        model.wait(30)
    emit({"benchmark": "frontend", "cpu_count": os.cpu_count(), "stub_batch_ms": args.batch_ms, "rows": rows,
          "summary": summarize(rows)}, args.out)


def summarize(rows: list[dict]) -> list[str]:
    """Best-of-trials CPU per request, and throughput scaling from the fewest workers."""
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["workload"], r["scenario"])
        if key not in best or r["router_cpu_ms_per_request"] < best[key]["router_cpu_ms_per_request"]:
            best[key] = r
    lines = [f"{w:<7} {s:<10} router {r['router_cpu_ms_per_request']:.3f} ms CPU/req, envoy "
             f"{r['envoy_cpu_ms_per_request']:.3f}, {r['throughput_rps']:.0f} req/s, p99 {r['p99_ms']:.1f} ms"
             for (w, s), r in sorted(best.items())]
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    main()
