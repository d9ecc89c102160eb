"""Which guard method to ship, measured: exemplar similarity against a fitted head, on the records
`fit` holds out and on whole attack categories left out of training (a stand-in for attacks from
another source), each at the threshold that blocks 1% of held-out allowed requests.

    python -m bench.guard.guard_study --data build/guard.train.jsonl --out build/bench-guard-study.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from esr_app.quality_cli import offline, piece_vectors
from esr_config import load_config
from router.guard import GuardScorer
from esr_tuning.guard import guard_report, load_guard_data, request_scores, split_groups, threshold_for, train_guard_head


def measure(scorer, held, vectors, target):
    scores = request_scores(scorer, held, vectors)
    blocked = np.asarray([r.blocked for r in held])
    threshold = threshold_for(scores[~blocked], target)
    return guard_report(held, scores, threshold)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=Path("router.yaml"))
    parser.add_argument("--data", type=Path, default=Path("build/guard.train.jsonl"))
    parser.add_argument("--fpr", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=Path("build/bench-guard-study.json"))
    args = parser.parse_args()
    config = load_config(args.config)
    requests = load_guard_data(args.data, config.requests)
    encoder, _ = offline(config)
    vectors = piece_vectors(encoder, requests)
    train, test = split_groups(requests, 0.2, 0)
    rows = {}

    def methods(train_requests):
        positives = sorted({r.text for r in train_requests if r.blocked})
        return {"exemplars": GuardScorer(exemplars=np.stack([vectors[t] for t in positives])),
                "head": GuardScorer(head=train_guard_head(train_requests, vectors))}

    for name, scorer in methods([requests[i] for i in train]).items():
        r = measure(scorer, [requests[i] for i in test], vectors, args.fpr)
        rows[f"{name}: held-out records"] = {"recall": r["recall"], "fpr": r["false_positive_rate"],
                                             "threshold": r["threshold"]}
    categories = sorted({r.category for r in requests if r.blocked})
    for category in categories:
        kept = [requests[i] for i in train if requests[i].category != category]
        left_out = [r for r in requests if r.category == category] + [requests[i] for i in test if not requests[i].blocked]
        for name, scorer in methods(kept).items():
            r = measure(scorer, left_out, vectors, args.fpr)
            rows[f"{name}: {category} left out"] = {"recall": r["recall"], "fpr": r["false_positive_rate"],
                                                    "threshold": r["threshold"]}
    for name in ("exemplars", "head"):
        left = [v["recall"] for k, v in rows.items() if k.startswith(name) and "left out" in k]
        rows[f"{name}: mean recall, category left out"] = {"recall": round(float(np.mean(left)), 4)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"fpr_target": args.fpr, "rows": rows}, indent=1))
    print(f"{'method / split':<48}{'recall':>8}{'fpr':>8}")
    for k, v in rows.items():
        print(f"{k:<48}{v['recall']:>8}{v.get('fpr', ''):>8}")


if __name__ == "__main__":
    main()
