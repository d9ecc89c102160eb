"""Builds a routes config from the CLINC150 train split: 10 domains as routes, out_of_scope as default.

CLINC150: Larson et al., "An Evaluation Dataset for Intent Classification and Out-of-Scope
Prediction", EMNLP 2019, CC BY 3.0. Read from ../shared/data/clinc150; nothing of it is committed.

    python examples/clinc150/build_config.py --train ../shared/data/clinc150/train.jsonl --out build/clinc150.yaml
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path

import yaml

DEFAULT = "out_of_scope"


def build(train: Path, per_route: int, seed: int, per_intent: int | None = None) -> dict:
    """`per_intent`: that many utterances of each intent (few-shot) instead of `per_route` per domain."""
    by_label: dict[str, list[str]] = defaultdict(list)
    by_intent: dict[tuple[str, str], list[str]] = defaultdict(list)
    for line in train.read_text().splitlines():
        row = json.loads(line)
        by_label[row["label"]].append(row["text"])
        by_intent[(row["label"], row.get("intent", row["label"]))].append(row["text"])
    rng = random.Random(seed)
    routes = []
    for label in sorted(by_label):
        if label == DEFAULT:
            continue
        if per_intent:
            chosen = []
            for (domain, _), texts in sorted(by_intent.items()):
                if domain == label:
                    texts = sorted(set(texts))
                    rng.shuffle(texts)
                    chosen += texts[:per_intent]
        else:
            chosen = sorted(set(by_label[label]))
            rng.shuffle(chosen)
            chosen = chosen[:per_route]
        routes.append({"name": label, "model": f"{label.replace('_', '-')}-model", "utterances": chosen})
    return {
        "encoder": {"model": "bundled:all-MiniLM-L6-v2", "device": "auto"},
        "classifier": {"method": "similarity", "top_k": 1, "aggregation": "mean"},
        "default_threshold": 0.5,
        "routes": routes,
        "default_route": {"name": DEFAULT, "model": "general-model", "utterances": sorted(set(by_label[DEFAULT]))},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--train", type=Path, default=Path("../shared/data/clinc150/train.jsonl"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--per-route", type=int, default=150, help="utterances kept per domain")
    p.add_argument("--per-intent", type=int, help="few-shot: this many utterances of each intent instead")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = "# Generated from CLINC150 (Larson et al., EMNLP 2019; CC BY 3.0) by examples/clinc150/build_config.py\n"
    args.out.write_text(header + yaml.safe_dump(build(args.train, args.per_route, args.seed, args.per_intent), sort_keys=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
