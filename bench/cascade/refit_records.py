"""The static tier refitted on recorded traffic (`fit --from-records`), on the config a team writes:
CLINC150 few-shot (10 utterances per intent, routes by domain) fitted with `fit --head` on those
utterances; then 10,000 other CLINC150 train prompts served by it and recorded (decided by the code
the server runs, written as the server writes records, no labels); then the refit. Both configs are
judged on CLINC150 val (3,100 prompts neither saw): the share the static tier decides, and the
cascade's accuracy against the encoder alone. Each step is the CLI a team runs, timed.

    python -m bench.cascade.refit_records [--records 10000] [--out build/bench-refit-records.json]

Needs ../shared/data/clinc150 (CC BY 3.0; read, never committed). Through Envoy: bench.cascade.cascade_bench
--config on each written config.
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
CLINC = ROOT.parent / "shared" / "data" / "clinc150"


def few_shot(work: Path, head: bool) -> Path:
    """The few-shot config, fitted on its own utterances (the default route's: CLINC's 100
    out-of-scope train prompts): a head (--head), or similarity with tuned thresholds."""
    sys.path.insert(0, str(ROOT / "examples" / "clinc150"))
    from build_config import build  # type: ignore[import-not-found]

    config = build(CLINC / "train.jsonl", 150, 0, per_intent=10)
    (work / "few.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with open(work / "few.jsonl", "w") as f:
        for route in [*config["routes"], config["default_route"]]:
            for text in route["utterances"]:
                f.write(json.dumps({"text": text, "label": route["name"]}) + "\n")
    out = work / ("few.head.yaml" if head else "few.similarity.yaml")
    cli_seconds("fit", "--config", str(work / "few.yaml"), "--data", str(work / "few.jsonl"), *(["--head"] if head else []),
        "--out", str(out))
    return out


def recorded(config_path: Path, work: Path, n: int, seed: int) -> Path:
    """`n` train prompts the config never saw, decided as the server decides them, written as records."""
    from esr_app.quality_cli import offline, text_vectors
    from esr_app.routing_build import static_tier
    from esr_config import load_config
    from esr_tuning.decide import decide_requests
    from esr_tuning.evaluation import one_message_facts, routed_texts_of

    config = load_config(config_path)
    seen = {t for r in [*config.routes, config.default_route] for t in r.utterances}
    pool = sorted({json.loads(line)["text"] for line in open(CLINC / "train.jsonl")} - seen)
    random.Random(seed).shuffle(pool)
    texts = routed_texts_of(config, pool[:n])
    encoder, classifier = offline(config)
    vectors = text_vectors(encoder, texts)
    facts_of = [one_message_facts(text) for text in texts]
    decided = decide_requests(config, classifier, [([t], f) for t, f in zip(texts, facts_of)], vectors, static_tier(config))
    path = work / (config_path.stem + ".records.jsonl")
    with open(path, "w") as f:
        for text, facts, d in zip(texts, facts_of, decided):
            f.write(json.dumps({"path": "/v1/chat/completions", "requested_model": "auto", "route": d.route,
                                "model": d.model, "reason": d.reason, "score": round(d.score, 4),
                                "confidence": round(d.confidence, 4), "tier": d.tier,
                                "facts": {"prompt_tokens": facts.prompt_tokens}, "texts": [text]}) + "\n")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=ROOT / "build" / "refit-records")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows, held = [], {}
    for head in (True, False):
        few = few_shot(args.work, head)
        records = recorded(few, args.work, args.records, args.seed)
        refit = few.with_suffix(".refit.yaml")
        report = few.with_suffix(".refit.json")
        seconds = cli_seconds("fit", "--config", str(few), "--from-records", str(records), "--out", str(refit),
                      "--report", str(report))
        held[few.stem] = json.loads(report.read_text())
        kind = "head" if head else "similarity"
        for name, path in ((f"few-shot {kind}", few), (f"few-shot {kind}, refit on records", refit)):
            rows.append({"config": name, **cascade_figures(path, CLINC / "val.jsonl"),
                         "refit_seconds": round(seconds, 1) if path == refit else None})
    emit({"records": args.records, "rows": rows, "held_out_records": held}, str(args.out) if args.out else None,
         ("config", "static_share", "accuracy", "encoder_alone_accuracy", "refit_seconds"))


if __name__ == "__main__":
    main()
