"""The front end's own cost against the least an ext_proc router can do (bench/frontend/minimal_servicer.py):
router CPU per pinned request (the body names a backend model: no embedding), each behind its own
Envoy whose routes answer directly, wrk at c64, trials interleaved.

    python -m bench.frontend.frontend_gap [--trials 3] [--seconds 8] [--out result.json]

Checks the issue's target: ours / minimal <= 1.15. Needs wrk and envoy.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from bench.harness import start_router
from bench.harness import PINNED_SCRIPT
from bench.harness import tree_cpu
from bench.harness import WRK_SCRIPT, run_wrk, start_direct_envoy, wrk_workdir
from bench.report import emit
from devstack.stack import ROOT, free_port

COLUMNS = ("variant", "trial", "throughput_rps", "p50_ms", "cpu_ms_per_request")


def start_minimal() -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.frontend.minimal_servicer", str(port)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    for line in proc.stdout:
        if line.startswith("router ready"):
            return proc, port
    raise RuntimeError("the minimal servicer did not start")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend.frontend_gap")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out")
    args = p.parse_args()
    workdir = wrk_workdir("frontend-gap")
    script = workdir / "pinned.lua"
    script.write_text(PINNED_SCRIPT + WRK_SCRIPT[WRK_SCRIPT.index("function response"):])
    (workdir / "ours").mkdir()
    stacks = {}
    try:
        stacks["ours"] = start_router(workdir / "ours", "cpu", None, deadline_ms=500)
        stacks["minimal"] = start_minimal()
        gateways = {}
        for name, (proc, port) in stacks.items():
            listener = free_port()
            gateways[name] = (start_direct_envoy(workdir / f"envoy-{name}.yaml", port, listener, free_port()), listener)
            run_wrk(listener, 16, 2, script, good=("model_pinned",))  # warm-up
        rows = []
        for trial in range(args.trials):
            for name in (list(stacks) if trial % 2 == 0 else reversed(list(stacks))):
                proc, _ = stacks[name]
                before = tree_cpu(proc.pid)
                row = run_wrk(gateways[name][1], 64, args.seconds, script, good=("model_pinned",))
                spent = tree_cpu(proc.pid) - before
                answered = row["goodput_rps"] * args.seconds
                rows.append({"variant": name, "trial": trial, **row,
                             "cpu_ms_per_request": round(1000 * spent / answered, 4) if answered else None})
    finally:
        for name, (proc, _) in stacks.items():
            proc.terminate()
            proc.wait(30)
        for envoy, _ in locals().get("gateways", {}).values():
            envoy.terminate()
            envoy.wait(30)

    def best(name: str) -> float | None:
        vals = [r["cpu_ms_per_request"] for r in rows if r["variant"] == name and r["cpu_ms_per_request"]]
        return min(vals) if vals else None

    ours, minimal = best("ours"), best("minimal")
    ratio = ours / minimal if ours and minimal else float("nan")
    checks = {"router CPU per pinned request, ours / minimal servicer (target <= 1.15)":
              {"ok": ratio <= 1.15, "detail": f"{ours} vs {minimal} ms: {ratio:.2f}x"}}
    emit({"benchmark": "frontend_gap", "cpu_count": os.cpu_count(), "rows": rows, "checks": checks}, args.out,
         columns=COLUMNS)


if __name__ == "__main__":
    main()
