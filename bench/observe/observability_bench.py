"""What seeing every decision costs: routed req/s at c64 through Envoy with decision records on
(every decision, no prompts, to a file) and with tracing on (10% sampled, exported over OTLP/gRPC to
a receiver in this process) against both off, each in its own router process on router.yaml (the
default 500 ms deadline, the embedding cache off so every request is embedded), behind its own
Envoy whose routes answer directly, driven by `wrk` with prompts unique across threads and runs;
trials interleaved.

    python -m bench.observe.observability_bench [--trials 3] [--seconds 8] [--out r.json]

Checks the targets, best trial against best trial: records / off >= 0.97, tracing / off >= 0.95.
Needs wrk and envoy.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

from bench.harness import launch_router
from bench.harness import WRK_SCRIPT, run_wrk, start_direct_envoy, wrk_workdir
from bench.harness import stop_stacks
from bench.report import emit
from devstack.stack import free_port
from tests.support.otlp import Receiver

ROOT = Path(__file__).resolve().parents[2]
ROUTED = ("matched", "default", "low_confidence", "context")
COLUMNS = ("variant", "trial", "scenario", "goodput_rps", "p50_ms", "p99_ms")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.observe.observability_bench")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out")
    args = p.parse_args()
    workdir = wrk_workdir("observability")
    script = workdir / "prompts.lua"
    script.write_text(WRK_SCRIPT)
    base = yaml.safe_load((ROOT / "router.yaml").read_text())
    base["cache_size"] = 0
    receiver = Receiver().__enter__()
    variants = {
        "off": {},
        "records": {"records": {"enabled": True, "path": str(workdir / "records.jsonl")}},
        "tracing": {"tracing": {"enabled": True, "endpoint": f"127.0.0.1:{receiver.port}", "sample_ratio": 0.1}},
    }
    stacks = {}
    rows = []
    try:
        for name, section in variants.items():
            proc, port = launch_router(workdir / f"router-{name}.yaml", {**base, **section})
            listener = free_port()
            stacks[name] = (proc, start_direct_envoy(workdir / f"envoy-{name}.yaml", port, listener, free_port(),
                                                      router_config=workdir / f"router-{name}.yaml"), listener)
            run_wrk(listener, 16, 2, script, good=ROUTED)  # warm-up
        for trial in range(args.trials):
            for name in list(variants)[trial % len(variants):] + list(variants)[:trial % len(variants)]:
                rows.append({"variant": name, "trial": trial, **run_wrk(stacks[name][2], 64, args.seconds, script,
                                                                         good=ROUTED)})
    finally:
        stop_stacks(stacks)
        receiver.__exit__(None, None, None)
    best = {name: max(r["goodput_rps"] for r in rows if r["variant"] == name) for name in variants}
    written = sum(1 for _ in open(workdir / "records.jsonl")) if (workdir / "records.jsonl").exists() else 0
    checks = {}
    for name, target, seen in (("records", 0.97, f"{written} records written"),
                               ("tracing", 0.95, f"{len(receiver.snapshot())} spans received")):
        ratio = best[name] / best["off"] if best["off"] else float("nan")
        checks[f"routed req/s at c64, {name} on / off (target >= {target})"] = {
            "ok": ratio >= target, "detail": f"{best[name]} vs {best['off']}: {ratio:.3f}x; {seen}"}
    emit({"benchmark": "observability", "cpu_count": os.cpu_count(), "rows": rows, "checks": checks}, args.out,
         columns=COLUMNS)


if __name__ == "__main__":
    main()
