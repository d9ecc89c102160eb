"""The static tier refitted on recorded conversations (`fit --from-records`), on the SGD config a team
writes: `examples/sgd/build_config.py` (40 utterances per domain, similarity, conversation policy
track) fitted on a few labelled dialogues (the first FEW of train); then other train dialogues served
by it request by request (each user turn's request carries the conversation so far), decided by the
code the server runs and written as the server writes records (the texts each request was routed
on, no labels); then the refit.
Both configs are judged on the dev dialogues (per user turn, routed with the turns before it): the
share of user turns the static tier decides, and accuracy against the encoder alone.

    python -m bench.cascade.refit_sgd [--dialogues 2850] [--out build/bench-refit-sgd.json]

Needs ../shared/data/sgd (Rastogi et al., AAAI 2020, CC BY-SA 4.0; read, never committed).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import yaml

from bench.harness import cascade_figures, cli_seconds
from bench.report import emit

ROOT = Path(__file__).resolve().parents[2]
SGD = ROOT.parent / "shared" / "data" / "sgd"


FEW = 150  # labelled dialogues the team's config is fitted on (of 3,000 in train)


def team_config(work: Path) -> Path:
    """build_config's config, fitted on the first FEW labelled train dialogues (its static tier,
    thresholds and conversation gate)."""
    sys.path.insert(0, str(ROOT / "examples" / "sgd"))
    from build_config import build  # type: ignore[import-not-found]

    config = build(SGD / "train.jsonl", 40, 0)
    (work / "sgd.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    lines = (SGD / "train.jsonl").read_text().splitlines()
    (work / "sgd.few.jsonl").write_text("\n".join(lines[:FEW]) + "\n")
    out = work / "sgd.fitted.yaml"
    cli_seconds("fit", "--config", str(work / "sgd.yaml"), "--data", str(work / "sgd.few.jsonl"), "--out", str(out))
    return out


def recorded(config_path: Path, work: Path, n: int, seed: int) -> tuple[Path, int]:
    """`n` train dialogues, each user turn's request decided as the server decides it, as records."""
    from esr_app.quality_cli import offline, text_vectors
    from esr_app.routing_build import static_tier
    from esr_config import load_config
    from esr_tuning.conversations import load_dialogues, predict, routed_texts

    config = load_config(config_path)
    dialogues = load_dialogues(SGD / "train.jsonl", [*config.route_names], config.requests.harness_tags)[FEW:]
    random.Random(seed).shuffle(dialogues)
    dialogues = dialogues[:n]
    encoder, classifier = offline(config)
    vectors = text_vectors(encoder, routed_texts(config, dialogues))
    decided = predict(config, classifier, dialogues, vectors, static_tier(config))
    texts = [t for d in dialogues for t in d.routed(config)]
    path = work / (config_path.stem + ".records.jsonl")
    with open(path, "w") as f:
        for routed, d in zip(texts, decided):
            f.write(json.dumps({"path": "/v1/chat/completions", "requested_model": "auto", "route": d.route,
                                "model": d.model, "reason": d.reason, "score": round(d.score, 4),
                                "confidence": round(d.confidence, 4), "tier": d.tier, "texts": list(routed)}) + "\n")
    return path, len(texts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dialogues", type=int, default=2850)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=ROOT / "build" / "refit-sgd")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    config = team_config(args.work)
    records, n = recorded(config, args.work, args.dialogues, args.seed)
    refit = config.with_suffix(".refit.yaml")
    report = config.with_suffix(".refit.json")
    seconds = cli_seconds("fit", "--config", str(config), "--from-records", str(records), "--out", str(refit),
                  "--report", str(report))
    rows = []
    for name, path in ((f"SGD config (40 utterances a domain, fitted on {FEW} dialogues)", config),
                       ("the same, refit on records", refit)):
        rows.append({"config": name, **cascade_figures(path, SGD / "dev.jsonl"),
                     "refit_seconds": round(seconds, 1) if path == refit else None})
    emit({"dialogues": args.dialogues, "records": n, "rows": rows, "held_out_records": json.loads(report.read_text())},
         str(args.out) if args.out else None,
         ("config", "static_share", "accuracy", "encoder_alone_accuracy", "refit_seconds"))


if __name__ == "__main__":
    main()
