"""`semantic-router select-fit`: model selection fitted on a team's eval rows (and the scores selection
feedback recorded), written beside the config."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from esr_config import ConfigError, leading_comments, load_or_exit, write_config
from esr_settings import replace_at

MIN_SCORED = 50  # prompts a model must have been scored on: fewer say little of how it does


def cmd_select_fit(args: argparse.Namespace) -> int:
    from esr_app.quality_cli import offline
    from esr_app.routing_build import static_tier
    from esr_tuning.evaluation import routed_texts_of
    from esr_tuning.feedback_rows import feedback_rows
    from esr_tuning.score_matrix import matrix, read_rows, with_observed
    from esr_tuning.selection_fit import fit_quality
    from router.selection import save_quality

    config = load_or_exit(args.config)
    if args.rows is None and not args.records:
        print("error: give --rows (eval rows), --records (decision records with selection feedback's scores), "
              "or both", file=sys.stderr)
        return 2
    try:
        rows = read_rows(args.rows) if args.rows is not None else []
        scored, counts = feedback_rows(args.records or [])
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scores = with_observed(matrix(rows, {**config.selection.prices}), scored)
    where = " and ".join(str(p) for p in [args.rows, *(args.records or [])] if p is not None)
    unknown = [m for m in scores.models if m not in config.backend_models]
    if unknown:
        print(f"error: {where}: models {unknown} are no route's model in {args.config}", file=sys.stderr)
        return 2
    seen = (~np.isnan(scores.scores)).sum(axis=0)
    few = {m: int(n) for m, n in zip(scores.models, seen) if n < MIN_SCORED}
    if len(scores.models) < 2 or few:
        print(f"error: {where}: each model needs {MIN_SCORED} prompts scored or more (two models at least); "
              f"{few or scores.models}", file=sys.stderr)
        return 2
    encoder, _ = offline(config)
    texts = routed_texts_of(config, scores.prompts)
    quality = fit_quality(scores.models, encoder.encode(texts), scores.scores, alpha=args.alpha)
    tier = static_tier(config)
    if tier is not None:  # the requests the static tier decides are selected from its own vectors
        static = fit_quality(scores.models, tier.encode(texts), scores.scores, alpha=args.alpha)
        quality = dataclasses.replace(quality, static=static)
    out = Path(args.out)
    path = out.with_suffix(".quality.npz")
    prices = {**dict(zip(scores.models, (round(float(c), 6) for c in scores.costs))), **config.selection.prices}
    try:  # each replace builds the section again, checked as a loaded one is; before any file is written
        fitted = replace_at(config, "selection", path=str(path.resolve()), prices=prices)
        if args.floor is not None:
            fitted = replace_at(fitted, "selection", quality_floor=args.floor)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    save_quality(quality, str(path), config.encoder.model)
    write_config(fitted, out, leading_comments(args.config))
    means = np.nanmean(scores.scores, axis=0)
    print(f"{len(scores.prompts) - len(scored)} prompts x {len(scores.models)} models from eval rows; "
          f"{len(scored)} scores from records" + (f" ({dict(sorted(counts.items()))})" if args.records else "")
          + f"; alpha {args.alpha}")
    static_margins = quality.static.margins if quality.static is not None else [None] * len(scores.models)
    print(f"{'model':24} {'mean score':>10} {'margin':>8} {'static':>8} {'price':>10}")
    for m, mean, margin, margin_static in zip(scores.models, means, quality.margins, static_margins):
        shown = "" if margin_static is None else f"{float(margin_static):.3f}"
        print(f"{m:24} {mean:10.3f} {float(margin):8.3f} {shown:>8} {prices[m]:10g}")
    print(f"wrote {out} (selection.path: {path.name})")
    return 0


def cmd_select_eval(args: argparse.Namespace) -> int:
    """A config's quality model judged on held-out score rows: its quality-cost curve against the
    single models, random mixes and the oracle, and where its policy lands."""
    import json

    import numpy as np

    from esr_app.quality_cli import offline
    from esr_tuning.evaluation import routed_texts_of
    from esr_tuning.score_matrix import matrix, read_rows
    from esr_tuning.selection_eval import evaluate
    from esr_tuning.selection_page import render
    from router.selection import load_quality

    config = load_or_exit(args.config)
    selection = config.selection
    if selection.path is None:
        print(f"error: {args.config}: selection.path is not set (semantic-router select-fit writes it)", file=sys.stderr)
        return 2
    try:
        quality = load_quality(selection.path)
        scores = matrix(read_rows(args.rows), {**selection.prices})
    except (OSError, ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = [m for m in quality.models if m not in scores.models]
    if missing or len(scores.prompts) < 20:
        print(f"error: {args.rows}: needs at least 20 prompts scored on every model the quality model chooses "
              f"between {list(quality.models)}" + (f" (none for {missing})" if missing else ""), file=sys.stderr)
        return 2
    columns = [scores.models.index(m) for m in quality.models]
    encoder, _ = offline(config)
    predicted = quality.predict(encoder.encode(routed_texts_of(config, scores.prompts)))
    prices = np.asarray([float(selection.prices.get(m, scores.costs[c])) for m, c in zip(quality.models, columns)])
    report = evaluate("quality model", predicted, quality.margins, scores.scores[:, columns], prices,
                      selection.quality_floor, quality.alpha, 0, selection.strategy, selection.budget, selection.lam)
    report["models"] = list(quality.models)
    if args.html:
        Path(args.html).write_text(render(report, list(quality.models), f"Model selection: {args.config}"))
    if args.json:
        print(json.dumps(report))
        return 0
    policy = report["policy"]
    strongest = max(range(len(prices)), key=lambda i: report["mean_score_per_model"][i])
    print(f"{len(scores.prompts)} held-out prompts x {len(quality.models)} models")
    print(f"{'model':24} {'price':>8} {'mean score':>10}")
    for m, p, mean in zip(quality.models, prices, report["mean_score_per_model"]):
        print(f"{m:24} {p:8g} {mean:10.3f}")
    print(f"policy ({policy['strategy']}): mean cost {policy['cost']:g} "
          f"({policy['cost'] / prices[strongest]:.2f}x always {quality.models[strongest]}), mean score {policy['score']:.3f}")
    print(f"cost at 95% of the strongest's score: {report['cost_at_95pct']:.2f}x (oracle {report['oracle_cost_at_95pct']:.2f}x); "
          f"APGR {report['apgr']:.3f} ({report['apgr_of_oracle']:.2f} of the oracle's)")
    print(f"under the floor where predicted met: {report['floor_violations']:.3f} (alpha {quality.alpha:g}); "
          f"beats single models: {report['beats_best_single']}, random mixes: {report['beats_random_mix']}")
    if args.html:
        print(f"wrote {args.html}")
    return 0


def add_parser(sub) -> None:
    sf = sub.add_parser("select-fit", help="fit model selection (quality by price) on eval rows: "
                        '{"prompt", "model", "score" 0..1, "cost"?} per line (docs/model-selection.md)')
    sf.add_argument("--config", type=Path, required=True)
    sf.add_argument("--rows", type=Path, help="JSONL score rows")
    sf.add_argument("--records", type=Path, nargs="+",
                    help="decision records (records.prompts on) holding selection feedback's scores: each score "
                         "a row for the model that answered")
    sf.add_argument("--out", type=Path, required=True, help="the config to write (its quality model beside it)")
    sf.add_argument("--alpha", type=float, default=0.1,
                    help="the share of requests allowed under the floor where the floor is predicted met")
    sf.add_argument("--floor", type=float, help="selection.quality_floor to write")

    def run(args: argparse.Namespace) -> int:
        if not 0.0 < args.alpha < 1.0:
            print("error: --alpha must be between 0 and 1", file=sys.stderr)
            return 2
        return cmd_select_fit(args)

    sf.set_defaults(func=run)
    se = sub.add_parser("select-eval", help="judge a config's model selection on held-out score rows: its "
                        "quality-cost curve against single models, random mixes and the oracle")
    se.add_argument("--config", type=Path, required=True)
    se.add_argument("--rows", type=Path, required=True, help="JSONL score rows the quality model was not fitted on")
    se.add_argument("--html", type=Path, help="also draw the curve: one self-contained page")
    se.add_argument("--json", action="store_true", help="one JSON object instead of the summary")
    se.set_defaults(func=cmd_select_eval)

