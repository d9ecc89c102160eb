"""What the prompt guard costs in routed requests per second and router CPU: the default router
against the same router with `make guard`'s fitted guard in its chain, and with that guard without
its static screen (every request embedded), each behind its own Envoy, driven by wrk at c64 with
unique prompts (cache off: every prompt the static tier leaves reaches the model); trials interleaved.

    python -m bench.guard.guard_cost --guard build/guard.fitted.yaml [--trials 3] [--seconds 8] [--out result.json]
    python -m bench.guard.guard_cost --guard build/clinc150.guard.yaml --config build/clinc150.fitted.yaml \
        --data ../shared/data/clinc150/val.jsonl          # the guard on the cascade's recipe

`--config`: the router the guard is added to (router.yaml); `--data`: held-out prompts sent as
written (bench.cascade.cascade_bench.wrk_script) instead of the synthetic ones.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench.harness import ROUTED, split_tallies, wrk_script
from bench.harness import launch_router
from bench.harness import tree_cpu
from bench.harness import WRK_SCRIPT, run_wrk, start_direct_envoy, wrk_workdir
from bench.harness import stop_stacks
from bench.report import emit
from devstack.stack import ROOT, free_port
from esr_config import load_config
from esr_settings import dump


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.guard.guard_cost")
    p.add_argument("--guard", type=Path, default=Path("build/guard.fitted.yaml"))
    p.add_argument("--config", type=Path, default=ROOT / "router.yaml")
    p.add_argument("--data", type=Path)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out")
    args = p.parse_args()
    workdir = wrk_workdir("guard-cost")
    # Read as the router reads them: the paths they name (a fine-tuned model, a head) made absolute,
    # since each variant's config is written elsewhere.
    fitted = dump(load_config(args.guard))
    base = dump(load_config(args.config))
    base["cache_size"] = 0
    guarded = {**base, "filters": fitted["filters"], "filter_settings": fitted["filter_settings"]}
    variants = {"without_guard": base, "with_guard": guarded}
    guard = fitted["filter_settings"].get("prompt_guard") or {}
    if "static_screen" in guard:
        unscreened = {k: v for k, v in guard.items() if k != "static_screen"}
        variants["guard_unscreened"] = {**guarded, "filter_settings": {**guarded["filter_settings"],
                                                                       "prompt_guard": unscreened}}
    script = workdir / "prompts.lua"
    if args.data is None:
        script.write_text(WRK_SCRIPT)
    else:
        script.write_text(wrk_script([json.loads(line)["text"] for line in args.data.read_text().splitlines()
                                      if line.strip()]))
    stacks = {}
    try:
        for name, config in variants.items():
            proc, port = launch_router(workdir / f"{name}.yaml", config)
            listener = free_port()
            stacks[name] = (proc, start_direct_envoy(workdir / f"envoy-{name}.yaml", port, listener, free_port()), listener)
            run_wrk(listener, 16, 2, script)  # warm-up
        rows = []
        for trial in range(args.trials):
            for name in (list(stacks) if trial % 2 == 0 else list(reversed(stacks))):
                before = tree_cpu(stacks[name][0].pid)
                row = run_wrk(stacks[name][2], 64, args.seconds, script, good=ROUTED)
                spent = tree_cpu(stacks[name][0].pid) - before
                if args.data is not None:
                    split_tallies(row, args.seconds)
                answered = row["goodput_rps"] * args.seconds
                rows.append({"variant": name, "trial": trial, **row,
                             "cpu_ms_per_request": round(1000 * spent / answered, 4) if answered else None})
    finally:
        stop_stacks(stacks)
    best = {name: max(r["goodput_rps"] for r in rows if r["variant"] == name) for name in stacks}
    ratio = best["with_guard"] / best["without_guard"]
    checks = {"routed req/s at c64 with the guard / without (target >= 0.8)": {
        "ok": ratio >= 0.8, "detail": f"{best['with_guard']} vs {best['without_guard']}: {ratio:.2f}x"}}
    if "guard_unscreened" in best:
        cpu = {name: min(r["cpu_ms_per_request"] for r in rows if r["variant"] == name and r["cpu_ms_per_request"])
               for name in stacks}
        checks["the static screen: router CPU per routed request, screened / unscreened guard"] = {
            "ok": cpu["with_guard"] <= cpu["guard_unscreened"],
            "detail": f"{cpu['with_guard']} vs {cpu['guard_unscreened']} ms ({cpu['without_guard']} without the guard): "
                      f"{cpu['with_guard'] / cpu['guard_unscreened']:.2f}x; req/s {best['with_guard']} vs "
                      f"{best['guard_unscreened']}"}
    emit({"benchmark": "guard_cost", "cpu_count": os.cpu_count(), "rows": rows, "checks": checks}, args.out,
         columns=("variant", "trial", "throughput_rps", "goodput_rps", "p50_ms", "p99_ms", "cpu_ms_per_request"))


if __name__ == "__main__":
    main()
