"""The prompt guard's static screen, measured: how much traffic it lets on without the encoder, and
what it costs the guard's recall, at several bars (a share of the lowest static score among the
held-out attacks the guard catches: esr_tuning.guard.SCREEN_MARGIN), on what `fit` holds out, on
benign traffic it never saw, and with each attack category left out of the fit in turn (a stand-in
for attacks from another source). Each guard at the threshold that blocks 1% of held-out allowed requests.

    python -m bench.guard.guard_screen [--config router.yaml] [--out build/bench-guard-screen.json]

Needs `make guard`'s data (build/guard.train.jsonl, build/guard.benign-heldout.jsonl) and a config
a static tier serves.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bench.report import emit
from esr_app.quality_cli import offline, piece_vectors
from esr_app.routing_build import static_tier
from esr_config import load_config
from esr_tuning.guard import (load_guard_data, request_scores, screen_with, screened, split_groups, static_head,
                              threshold_for, train_guard_head)
from router.guard import GuardScorer

MARGINS = (1.0, 0.5, 0.2, 0.1)
COLUMNS = ("margin", "left_out_recall_guard", "left_out_recall_screened", "categories_losing_recall",
           "held_out_allowed_cleared", "benign_cleared")


def guard_and_screens(requests, train, held, vectors, static, target: float):
    """The guard head fitted on `train`, its threshold on `held`, and a screen per margin."""
    head = train_guard_head([requests[i] for i in train], vectors)
    scorer = GuardScorer(head=head)
    held_requests = [requests[i] for i in held]
    scores = request_scores(scorer, held_requests, vectors)
    blocked = np.asarray([r.blocked for r in held_requests])
    threshold = threshold_for(scores[~blocked], target)
    caught = blocked & (scores >= threshold)
    head, static_vectors = static_head(requests, train, static)
    return scorer, threshold, {m: screen_with(head, static_vectors, requests, held, caught, static, m)[0]
                               for m in MARGINS}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.guard.guard_screen")
    p.add_argument("--config", type=Path, default=Path("router.yaml"))
    p.add_argument("--data", type=Path, default=Path("build/guard.train.jsonl"))
    p.add_argument("--benign", type=Path, default=Path("build/guard.benign-heldout.jsonl"))
    p.add_argument("--fpr", type=float, default=0.01)
    p.add_argument("--out")
    args = p.parse_args()
    config = load_config(args.config)
    tier = static_tier(config)
    if tier is None:
        raise SystemExit(f"{args.config}: no static tier serves this config: no screen to measure")
    static = tier.embedding
    requests = load_guard_data(args.data, config.requests)
    benign = load_guard_data(args.benign, config.requests)
    encoder, _ = offline(config)
    vectors = piece_vectors(encoder, requests + benign)
    train, held = split_groups(requests, 0.2, 0)
    scorer, threshold, screens = guard_and_screens(requests, train, held, vectors, static, args.fpr)
    held_allowed = [requests[i] for i in held if not requests[i].blocked]
    categories = sorted({r.category for r in requests if r.blocked})
    left_out = {}
    for category in categories:
        # Nothing of the category reaches the fit: neither the heads nor the screen's bar.
        kept, kept_held = ([i for i in part if requests[i].category != category] for part in (train, held))
        left = [r for r in requests if r.category == category]
        guard, bar, by_margin = guard_and_screens(requests, kept, kept_held, vectors, static, args.fpr)
        caught = request_scores(guard, left, vectors) >= bar
        left_out[category] = (caught, {m: caught & ~screened(s, static.encode, left) for m, s in by_margin.items()})
    rows = []
    for margin in MARGINS:
        losing = [c for c, (caught, kept) in left_out.items() if kept[margin].mean() < caught.mean()]
        rows.append({
            "margin": margin,
            "left_out_recall_guard": round(float(np.mean([c.mean() for c, _ in left_out.values()])), 4),
            "left_out_recall_screened": round(float(np.mean([k[margin].mean() for _, k in left_out.values()])), 4),
            "categories_losing_recall": ",".join(losing) or "none",
            "held_out_allowed_cleared": round(float(screened(screens[margin], static.encode, held_allowed).mean()), 4),
            "benign_cleared": round(float(screened(screens[margin], static.encode, benign).mean()), 4),
        })
    emit({"benchmark": "guard_screen", "config": str(args.config), "categories": categories,
          "guard_threshold": threshold, "rows": rows}, args.out, COLUMNS)


if __name__ == "__main__":
    main()
