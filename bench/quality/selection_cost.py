"""What model selection adds to a routed request through Envoy: router.yaml (static tier on, cache off)
with every route offered five models, served without selection, with it, and with it and feedback
(ids signed, corrections applied, 2% explored); each behind its own Envoy whose routes answer
directly, driven by wrk at c64 with unique short prompts; the router's CPU per routed request from
/proc; trials interleaved.

    python -m bench.quality.selection_cost [--trials 3] [--seconds 8] [--out result.json]

The quality model is random (the cost of a prediction does not depend on what it learned), for the
encoder's vectors and the static tier's alike, so whichever tier decides, selection chooses.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

import numpy as np

from bench.harness import (ROUTED, launch_router, run_wrk, split_tallies, start_direct_envoy, tree_cpu, wrk_script,
                           wrk_workdir)
from bench.harness import stop_stacks
from bench.report import emit
from bench.workloads import short_prompts
from devstack.stack import ROOT, free_port
from esr_app.routing_build import static_tier
from esr_config import load_config
from esr_settings import dump, replace_at
from router.selection import QualityModel, save_quality

MODELS = ("general-model", "math-model", "code-model", "small-model", "large-model")
TOKEN = "selection-cost-bench-token-0123456789"
COLUMNS = ("variant", "scenario", "throughput_rps", "goodput_rps", "p50_ms", "p99_ms", "cpu_ms_per_request")


def quality(dimension: int, static_dimension: int) -> QualityModel:
    rng = np.random.default_rng(0)

    def model(d: int) -> QualityModel:
        weights = rng.normal(0, 0.05, (len(MODELS), d + 1)).astype(np.float32)
        weights[:, -1] = np.linspace(0.7, 0.95, len(MODELS))
        return QualityModel(MODELS, weights, np.full(len(MODELS), 0.02, np.float32), 0.1)

    return dataclasses.replace(model(dimension), static=model(static_dimension))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out")
    args = p.parse_args()
    workdir = wrk_workdir("selection-cost")
    script = workdir / "prompts.lua"
    script.write_text(wrk_script(short_prompts(4000, seed=7)))
    base = load_config(ROOT / "router.yaml")
    save_quality(quality(384, static_tier(base).encode(["x"]).shape[-1]), str(workdir / "quality.npz"),
                 "bundled:all-MiniLM-L6-v2")
    base = replace_at(base, "cache_size", 0)
    raw = dump(base)
    for route in [*raw["routes"], raw["default_route"]]:
        first = route.get("model", MODELS[0])
        route["models"] = [first, *(m for m in MODELS if m != first)]
    selection = {"path": str(workdir / "quality.npz"), "quality_floor": 0.8,
                 "prices": {m: float(i + 1) for i, m in enumerate(MODELS)}}
    variants = {"off": raw,
                "selection": {**raw, "selection": selection},
                "selection+feedback": {**raw, "selection": {**selection, "feedback": {"enabled": True}}}}
    os.environ["SEMANTIC_ROUTER_FEEDBACK_TOKEN"] = TOKEN  # the routers inherit it
    stacks = {}
    rows = []
    try:
        for name, config in variants.items():
            path = workdir / f"router-{name}.yaml"
            proc, port = launch_router(path, config)
            stacks[name] = (proc, None, None)
            listener = free_port()
            envoy = start_direct_envoy(workdir / f"envoy-{name}.yaml", port, listener, free_port(), router_config=path)
            stacks[name] = (proc, envoy, listener)
            run_wrk(listener, 16, 2, script, good=ROUTED)  # warm-up
        names = list(variants)
        for trial in range(args.trials):
            for name in names[trial % len(names):] + names[:trial % len(names)]:
                proc, _, listener = stacks[name]
                for c in (1, 64):
                    before = tree_cpu(proc.pid)
                    row = run_wrk(listener, c, args.seconds, script, good=ROUTED)
                    spent = tree_cpu(proc.pid) - before
                    split_tallies(row, args.seconds)  # the tier tallies are not answers
                    routed = row["goodput_rps"] * args.seconds
                    rows.append({"variant": name, "trial": trial, **row,
                                 "cpu_ms_per_request": round(1000 * spent / routed, 3) if routed else None})
    finally:
        stop_stacks(stacks)

    def cpu(variant: str) -> list[float]:
        return [r["cpu_ms_per_request"] for r in rows if r["variant"] == variant and r["scenario"] == "envoy_c64"]

    # What a run can resolve: the spread of one variant's own trials. A difference inside it is not
    # a measurement of selection's cost (Selector.order alone: bench.quality.selection_bench).
    off = statistics.median(cpu("off"))
    spread = max(max(cpu(v)) - min(cpu(v)) for v in variants)
    checks = {f"router CPU per routed request at c64, {v} - off (target <= 0.05 ms)": {
        "ok": statistics.median(cpu(v)) - off <= 0.05,
        "detail": f"{statistics.median(cpu(v)) - off:+.3f} ms ({statistics.median(cpu(v))} vs {off}, medians of "
                  f"{args.trials} trials; a variant's own trials spread {spread:.2f} ms)"}
        for v in ("selection", "selection+feedback")}
    emit({"benchmark": "selection_cost", "cpu_count": os.cpu_count(), "rows": rows, "checks": checks}, args.out,
         columns=COLUMNS)


if __name__ == "__main__":
    main()
