"""Builds a routes config from the SGD train split: one route per domain, routed per conversation.

Schema-Guided Dialogue: Rastogi, Zang, Sunkara, Gupta, Khaitan, "Towards Scalable Multi-Domain
Conversational Agents: The Schema-Guided Dialogue Dataset", AAAI 2020 (arXiv:1909.05855), CC BY-SA 4.0.
Read from ../shared/data/sgd; nothing of it is committed. A config written from it carries its
utterances, so it is under CC BY-SA 4.0 too (the header written into it says so).

    python examples/sgd/build_config.py --train ../shared/data/sgd/train.jsonl --out build/sgd.yaml
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path

import yaml

TOPIC_WORDS = 7  # example utterances are turns of at least this many words: they name their topic


def build(train: Path, per_route: int, seed: int) -> dict:
    by_label: dict[str, set[str]] = defaultdict(set)
    for line in train.read_text().splitlines():
        row = json.loads(line)
        turns = [m["content"] for m in row["messages"] if m["role"] == "user"]
        for text, label in zip(turns, row["labels"]):
            if len(text.split()) >= TOPIC_WORDS:
                by_label[label].add(text)
    rng = random.Random(seed)
    routes = []
    for label in sorted(by_label):
        texts = sorted(by_label[label])
        rng.shuffle(texts)
        routes.append({"name": label, "model": f"{label.lower()}-model", "utterances": texts[:per_route]})
    return {
        "encoder": {"model": "bundled:all-MiniLM-L6-v2", "device": "auto"},
        "classifier": {"method": "similarity", "top_k": 5, "aggregation": "mean"},
        "default_threshold": 0.3,
        "routes": routes,
        "default_route": {"name": "general", "model": "general-model"},
        "conversation": {"policy": "track", "max_turns": 8},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--train", type=Path, default=Path("../shared/data/sgd/train.jsonl"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--per-route", type=int, default=40, help="utterances kept per domain")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Generated from the Schema-Guided Dialogue dataset (Rastogi et al., AAAI 2020; CC BY-SA 4.0)\n"
              "# by examples/sgd/build_config.py. It holds utterances from the dataset: share it under CC BY-SA 4.0.\n")
    args.out.write_text(header + yaml.safe_dump(build(args.train, args.per_route, args.seed), sort_keys=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
