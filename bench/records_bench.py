"""What decision records cost: routed req/s at c64 through Envoy, records on (every decision, no
prompts, to a file) against off, each in its own router process on router.yaml (the default 500 ms
deadline, the embedding cache off so every request is embedded), behind its own Envoy whose routes
answer directly, driven by `wrk` with prompts unique across threads and runs; trials interleaved.

    python -m bench.records_bench [--trials 3] [--seconds 8] [--out r.json]

Checks the target: records on / off >= 0.97, best trial against best trial. Needs wrk and envoy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import yaml

from bench.ext_proc_bench import launch_router
from bench.overload_bench import WRK_SCRIPT, run_wrk, start_direct_envoy
from bench.report import emit
from devstack.stack import free_port

ROOT = Path(__file__).resolve().parent.parent
ROUTED = ("matched", "default", "low_confidence", "context")
COLUMNS = ("variant", "trial", "scenario", "goodput_rps", "p50_ms", "p99_ms")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.records_bench")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out")
    args = p.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("the records benchmark needs wrk: apt-get install wrk")
    workdir = Path(tempfile.mkdtemp(prefix="bench-records-"))
    script = workdir / "prompts.lua"
    script.write_text(WRK_SCRIPT)
    base = yaml.safe_load((ROOT / "router.yaml").read_text())
    base["cache_size"] = 0
    variants = {"off": {"enabled": False}, "on": {"enabled": True, "path": str(workdir / "records.jsonl")}}
    stacks = {}
    rows = []
    try:
        for name, records in variants.items():
            proc, port = launch_router(workdir / f"router-{name}.yaml", {**base, "records": records})
            listener = free_port()
            stacks[name] = (proc, start_direct_envoy(workdir / f"envoy-{name}.yaml", port, listener, free_port(),
                                                      router_config=workdir / f"router-{name}.yaml"), listener)
            run_wrk(listener, 16, 2, script, good=ROUTED)  # warm-up
        for trial in range(args.trials):
            for name in variants if trial % 2 == 0 else reversed(list(variants)):
                rows.append({"variant": name, "trial": trial, **run_wrk(stacks[name][2], 64, args.seconds, script,
                                                                         good=ROUTED)})
    finally:
        for proc, envoy, _ in stacks.values():
            for q in (envoy, proc):
                q.terminate()
                q.wait(30)
    best = {name: max(r["goodput_rps"] for r in rows if r["variant"] == name) for name in variants}
    ratio = best["on"] / best["off"] if best["off"] else float("nan")
    written = sum(1 for _ in open(workdir / "records.jsonl")) if (workdir / "records.jsonl").exists() else 0
    checks = {"routed req/s at c64, records on / off (target >= 0.97)": {
        "ok": ratio >= 0.97, "detail": f"{best['on']} vs {best['off']}: {ratio:.3f}x; {written} records written"}}
    emit({"benchmark": "records", "cpu_count": os.cpu_count(), "rows": rows, "checks": checks}, args.out,
         columns=COLUMNS)


if __name__ == "__main__":
    main()
