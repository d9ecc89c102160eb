"""What model selection adds to a routed request through Envoy: router.yaml (static tier on, cache off)
with every route offered five models, served without selection, with it, and with it and feedback
(ids signed, corrections applied, 2% explored); each behind its own Envoy whose routes answer
directly, driven by wrk at c64; the router's CPU per routed request from /proc; trials interleaved,
each variant against `off` in the same trial (paired), the mean difference with a bootstrap 95%
interval.

    python -m bench.quality.selection_cost [--trials 8] [--seconds 6] [--variants off selection ...] [--out result.json]

The prompts are router.yaml's utterances made unique ("<utterance> for case <n>"), kept where the
static tier decides them, by the code the server runs (~95%): selection's work is the same whichever
tier decided (one product with that tier's vector), and without the encoder's ~10 ms a request
the router's CPU per request is small enough for a trial to resolve hundredths of a millisecond.
The quality model is random (the cost of a prediction does not depend on what it learned).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random

import numpy as np

from bench.harness import (ROUTED, launch_router, run_wrk, split_tallies, start_direct_envoy, tree_cpu, wrk_script,
                           wrk_workdir)
from bench.harness import stop_stacks
from bench.report import emit
from devstack.stack import ROOT, free_port
from esr_app.routing_build import static_tier
from esr_config import load_config
from esr_settings import dump, replace_at
from router.selection import QualityModel, save_quality

MODELS = ("general-model", "math-model", "code-model", "small-model", "large-model")
TOKEN = "selection-cost-bench-token-0123456789"
VARIANTS = ("off", "selection", "selection+feedback")
COLUMNS = ("variant", "trial", "scenario", "throughput_rps", "goodput_rps", "p50_ms", "p99_ms", "cpu_ms_per_request")


def quality(dimension: int, static_dimension: int) -> QualityModel:
    rng = np.random.default_rng(0)

    def model(d: int) -> QualityModel:
        weights = rng.normal(0, 0.05, (len(MODELS), d + 1)).astype(np.float32)
        weights[:, -1] = np.linspace(0.7, 0.95, len(MODELS))
        return QualityModel(MODELS, weights, np.full(len(MODELS), 0.02, np.float32), 0.1)

    return dataclasses.replace(model(dimension), static=model(static_dimension))


def statically_decided(config, n: int, seed: int = 7) -> list[str]:
    """`n` unique prompts the config's static tier decides: its routes' utterances, each made unique."""
    tier = static_tier(config)
    utterances = [u for r in config.routes for u in r.utterances]
    rng = random.Random(seed)
    out: list[str] = []
    case = 0
    while len(out) < n:
        case += 1
        text = f"{rng.choice(utterances)} {rng.choice(('for', 'with', 'in'))} case {case}"
        if tier.decide([text]) is not None:
            out.append(text)
    return out


def paired(rows: list[dict], variant: str, base: str = "off", seed: int = 0) -> dict:
    """The variant's CPU per routed request less `base`'s, trial by trial: mean and bootstrap 95% interval."""
    by_trial = {(r["variant"], r["trial"]): r["cpu_ms_per_request"] for r in rows}
    diffs = np.asarray([by_trial[(variant, t)] - by_trial[(base, t)]
                        for (v, t) in by_trial if v == variant and (base, t) in by_trial])
    means = np.random.default_rng(seed).choice(diffs, (10_000, len(diffs))).mean(axis=1)
    return {"mean_ms": round(float(diffs.mean()), 4), "low_ms": round(float(np.percentile(means, 2.5)), 4),
            "high_ms": round(float(np.percentile(means, 97.5)), 4), "trials": len(diffs)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="the first is what the others are paired with")
    p.add_argument("--out")
    args = p.parse_args()
    workdir = wrk_workdir("selection-cost")
    base = load_config(ROOT / "router.yaml")
    script = workdir / "prompts.lua"
    script.write_text(wrk_script(statically_decided(base, 4000)))
    save_quality(quality(384, static_tier(base).encode(["x"]).shape[-1]), str(workdir / "quality.npz"),
                 "bundled:all-MiniLM-L6-v2")
    base = replace_at(base, "cache_size", 0)
    raw = dump(base)
    for route in [*raw["routes"], raw["default_route"]]:
        first = route.get("model", MODELS[0])
        route["models"] = [first, *(m for m in MODELS if m != first)]
    selection = {"path": str(workdir / "quality.npz"), "quality_floor": 0.8,
                 "prices": {m: float(i + 1) for i, m in enumerate(MODELS)}}
    every = {"off": raw,
             "selection": {**raw, "selection": selection},
             "selection+feedback": {**raw, "selection": {**selection, "feedback": {"enabled": True}}}}
    variants = {name: every[name] for name in args.variants}
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
                before = tree_cpu(proc.pid)
                row = run_wrk(listener, args.concurrency, args.seconds, script, good=ROUTED)
                spent = tree_cpu(proc.pid) - before
                split_tallies(row, args.seconds)  # the tier tallies are not answers
                routed = row["goodput_rps"] * args.seconds
                rows.append({"variant": name, "trial": trial, **row,
                             "cpu_ms_per_request": round(1000 * spent / routed, 4) if routed else None})
    finally:
        stop_stacks(stacks)

    checks = {}
    base = args.variants[0]
    for v in args.variants[1:]:
        d = paired(rows, v, base)
        checks[f"router CPU per routed request, {v} - {base} (target <= 0.05 ms, the interval's top)"] = {
            "ok": d["high_ms"] <= 0.05,
            "detail": f"{d['mean_ms']:+.3f} ms, 95% interval {d['low_ms']:+.3f} to {d['high_ms']:+.3f} "
                      f"({d['trials']} paired trials at c{args.concurrency})", **d}
    emit({"benchmark": "selection_cost", "cpu_count": os.cpu_count(), "rows": rows, "checks": checks}, args.out,
         columns=COLUMNS)


if __name__ == "__main__":
    main()
