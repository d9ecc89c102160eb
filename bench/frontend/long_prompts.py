"""Which part of a long prompt to route on (requests.truncate: head, tail or ends), measured.

CLINC150 val questions (in scope) made long: filler (~4x the routed cap) placed after the question (a
question, then a pasted document), before it (a document, then the question), or on both sides (the
question in the middle). Filler `logs`: generated service log lines, about nothing a route is about;
`sgd`: SGD dialogue text, which is about restaurants, flights and music, as some CLINC150 intents are. Each config routes them as the server
does (esr_tuning.evaluation: the same texts_to_route cut, then the encoder's own cut of the tokens); the
table is the accuracy per placement.

    python -m bench.frontend.long_prompts --config build/clinc150.fitted.yaml --out build/bench-long-prompts.json
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

from esr_settings import replace_at
from esr_app.quality_cli import offline
from esr_config import load_config
from esr_tuning.evaluation import decide_labelled, routed_texts_of

CLINC = Path("../shared/data/clinc150/val.jsonl")
SGD = Path("../shared/data/sgd/dev.jsonl")


def filler(rng: random.Random, dialogues: list[list[str]] | None, chars: int) -> str:
    out: list[str] = []
    while sum(map(len, out)) < chars:
        if dialogues is None:
            out.append(f"2026-11-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
                       f"{rng.randint(0, 59):02d}Z INFO worker-{rng.randint(1, 16)} request id={rng.getrandbits(48):012x} "
                       f"status=200 bytes={rng.randint(100, 99999)} duration_ms={rng.randint(1, 900)}")
        else:
            out.extend(rng.choice(dialogues))
    return "\n".join(out)[:chars]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, default=Path("build/clinc150.fitted.yaml"))
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--filler", choices=("logs", "sgd"), default="logs")
    parser.add_argument("--out", type=Path, default=Path("build/bench-long-prompts.json"))
    args = parser.parse_args()
    base = load_config(args.config)
    rng = random.Random(0)
    rows = [json.loads(line) for line in CLINC.read_text().splitlines()]
    rows = [r for r in rows if r["label"] != base.default_route.name]
    rng.shuffle(rows)
    rows = rows[: args.limit]
    dialogues = ([[m["content"] for m in json.loads(line)["messages"]] for line in SGD.read_text().splitlines()]
                 if args.filler == "sgd" else None)
    cap = base.requests.prompt_max_tokens * 4  # characters of the encoder's window, about
    placements = {
        "short (no filler)": lambda q: q,
        "question first": lambda q: q + "\n" + filler(rng, dialogues, 4 * cap),
        "question last": lambda q: filler(rng, dialogues, 4 * cap) + "\n" + q,
        "question in the middle": lambda q: filler(rng, dialogues, 2 * cap) + "\n" + q + "\n" + filler(rng, dialogues, 2 * cap),
    }
    prompts = {name: [make(r["text"]) for r in rows] for name, make in placements.items()}
    labels = np.asarray([r["label"] for r in rows])
    results = {}
    for keep in ("head", "tail", "ends"):
        config = replace_at(base, "requests", truncate=keep)
        encoder, classifier = offline(config)  # the encoder keeps the same part of the tokens
        for name, texts in prompts.items():
            embeddings = encoder.encode(routed_texts_of(config, texts))
            routes = np.asarray([d.route for d in decide_labelled(config, classifier, texts, embeddings)])
            results.setdefault(name, {})[keep] = round(float((routes == labels).mean()), 4)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": str(args.config), "filler": args.filler, "examples": len(rows), "cap_chars": cap,
                                    "accuracy": results}, indent=1))
    print(f"{'placement':<26}{'head':>8}{'tail':>8}{'ends':>8}")
    for name, r in results.items():
        print(f"{name:<26}{r['head']:>8}{r['tail']:>8}{r['ends']:>8}")


if __name__ == "__main__":
    main()
