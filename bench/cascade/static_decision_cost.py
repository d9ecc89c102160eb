"""What the static tier costs the event loop per prompt, in process, step by step: warm, and with the
CPU's caches flushed before each step (an 8 MiB buffer written between prompts).

    python -m bench.cascade.static_decision_cost [--config build/clinc150.fitted.yaml] [--prompts 1500] [--out r.json]

Why flushed: behind Envoy the loop shares two cores with Envoy, wrk and gRPC's threads, which evict
what the last request left in the caches, so each request pays for its reads from memory again.
Through Envoy a statically decided request cost the loop ~0.23 ms more than a pinned one, where
this harness warm said ~0.1 ms; flushed, it says ~0.15-0.2 ms (docs/notes/static-tier-history.md). Each step is
timed on its own, so the flushed steps add up to more than the flushed whole (`weigh`).
Needs a fitted config with a static tier (make clinc150).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.report import emit

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ("step", "warm_us", "flushed_us")
FLUSH_BYTES = 8 << 20


def main() -> None:
    from esr_app.routing_build import static_tier
    from esr_config import load_config
    from router.static_tier import own_turn_lead

    p = argparse.ArgumentParser(prog="python -m bench.cascade.static_decision_cost")
    p.add_argument("--config", type=Path, default=ROOT / "build/clinc150.fitted.yaml")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/clinc150/val.jsonl")
    p.add_argument("--prompts", type=int, default=1500)
    p.add_argument("--out")
    args = p.parse_args()
    if not args.config.is_file():
        raise SystemExit(f"{args.config}: no fitted config (make clinc150)")
    tier = static_tier(load_config(args.config))
    if tier is None:
        raise SystemExit(f"{args.config}: no static tier to measure")
    texts = [json.loads(line)["text"] for line in args.data.read_text().splitlines() if line.strip()][:args.prompts]
    classifier, buffer = tier.classifier, np.ones(FLUSH_BYTES // 4, dtype=np.float32)
    steps = ("encode", "scores", "lead", "in_scope", "decision", "weigh")
    spent = {step: [0.0, 0.0] for step in steps}
    for flushed in (0, 1):
        for text in texts:
            def timed(step, fn):
                if flushed:
                    buffer.__iadd__(1.0)
                started = time.perf_counter()
                value = fn()
                spent[step][flushed] += time.perf_counter() - started
                return value

            vectors = timed("encode", lambda: tier.encode([text]))
            scores = timed("scores", lambda: classifier.scores(vectors))
            choice, _ = timed("lead", lambda: own_turn_lead(classifier, scores, tier.gate))
            timed("in_scope", lambda: tier._near_enough(vectors[-1]))
            if choice >= 0:
                timed("decision", lambda: classifier.decision(scores[-1], choice, "matched"))
            timed("weigh", lambda: tier.weigh([text]))
    rows = [{"step": step, "warm_us": round(warm / len(texts) * 1e6, 1), "flushed_us": round(cold / len(texts) * 1e6, 1)}
            for step, (warm, cold) in spent.items()]
    emit({"benchmark": "static_decision_cost", "config": str(args.config), "prompts": len(texts), "rows": rows},
         args.out, COLUMNS)


if __name__ == "__main__":
    main()
