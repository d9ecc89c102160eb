"""The offline commands, classify, eval and fit: they score the same texts, with the same code,
as the server routes on (docs/routing-quality.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from esr_app.placement import static_tier_on
from esr_app.routing_build import static_embedding, static_tier
from esr_config import RouterConfig, leading_comments, load_or_exit, write_config
from esr_settings import replace_at


def cmd_classify(args: argparse.Namespace) -> int:
    from esr_tuning.evaluation import decide_labelled, routed_texts_of

    config = load_or_exit(args.config)
    encoder, classifier = offline(config)
    # As the server decides a one-message request: rules, the static tier, then the encoder.
    decisions = decide_labelled(config, classifier, args.text, encoder.encode(routed_texts_of(config, args.text)),
                                static_tier(config))
    for decision in decisions:
        if args.json:
            print(json.dumps(dataclasses.asdict(decision)))
        else:
            print(f"route={decision.route} model={decision.model} score={decision.score:.4f} reason={decision.reason} "
                  f"confidence={decision.confidence:.4f}")
    return 0


def offline(config: RouterConfig):
    """Encoder and classifier for offline commands (no batcher, no server)."""
    from esr_app.embedding import make_backend
    from esr_app.logs import setup_logging
    from esr_tuning.each_text_once import EachTextOnce
    from router.classifier import RouteClassifier

    setup_logging("warning")
    encoder = EachTextOnce(make_backend(config, offline=True))
    return encoder, RouteClassifier(config, encoder.encode)


def _labelled(config: RouterConfig, path: Path):
    from esr_tuning.evaluation import load_labelled

    with _data_errors(OSError, ValueError):
        return load_labelled(path, config.route_names)


@contextlib.contextmanager
def _data_errors(*kinds: type[Exception]):
    """Data that cannot be used (unreadable, malformed, too little of it) ends the command: exit 2, the reason."""
    try:
        yield
    except kinds as exc:
        print(f"data error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _semantic_cache_report(config: RouterConfig, classifier, encoder, data, embeddings) -> dict | None:
    """The response cache's semantic matching on this data (esr_tuning.cache_tuning), when the config
    turns it on for some route and the data has intents; None otherwise."""
    from esr_tuning.cache_tuning import semantic_report
    from esr_tuning.evaluation import decide_labelled, routed_texts_of

    if not config.cache.semantic or data.intents is None:
        return None
    routes = [d.route for d in decide_labelled(config, classifier, data.texts, embeddings)]
    # The cache compares the turn as sent (its plain text), not the routed text: the same unless cut.
    same = routed_texts_of(config, data.texts) == list(data.texts)
    vectors = embeddings if same else encoder.encode(list(data.texts))
    return semantic_report(routes, data.texts, data.intents, vectors, set(config.cache.semantic))


def _report(classifier, embeddings, data, config: RouterConfig, static=None) -> dict:
    """`static`: the cascade's first tier (router/static_tier.py), as the server runs it; None: off."""
    from esr_tuning.evaluation import decide_labelled, evaluate

    decisions = decide_labelled(config, classifier, data.texts, embeddings, static)
    report = evaluate(data.labels, decisions, list(config.route_names), config.default_route.name)
    if static is not None:
        _with_encoder_alone(report, config, data.labels, decide_labelled(config, classifier, data.texts, embeddings))
        _without_encoder(report, config, classifier, data, static)
    return report


def _without_encoder(report: dict, config: RouterConfig, classifier, data, static) -> None:
    """`report` with the accuracy were the encoder to answer nothing (decide_without_encoder): by
    the static tier's guess (static_tier.fallback: guess), and by the default route."""
    from esr_tuning.evaluation import decide_without_encoder, evaluate
    from router.static_tier import StaticTier

    names, default = list(config.route_names), config.default_route.name
    report["without_encoder"] = {}
    for fallback in ("guess", "default"):
        cfg = replace_at(config, "static_tier.fallback", fallback)
        tier = StaticTier(cfg, static.encode, static.classifier.head)
        measured = evaluate(data.labels, decide_without_encoder(cfg, classifier, data.texts, tier), names, default)
        report["without_encoder"][fallback] = measured["accuracy"]


def _with_encoder_alone(report: dict, config: RouterConfig, labels, alone) -> None:
    """`report` (the cascade's) with the accuracy of `alone`, the same requests' decisions with the
    static tier off, beside it."""
    from esr_tuning.evaluation import evaluate

    measured = evaluate(labels, alone, list(config.route_names), config.default_route.name)
    report["encoder_alone_accuracy"] = measured["accuracy"]
    if measured.get("shifted"):
        report["encoder_alone_shifted"] = measured["shifted"]["accuracy"]


def _dialogues(config: RouterConfig, path: Path):
    from esr_tuning.conversations import load_dialogues

    with _data_errors(OSError, ValueError):
        return load_dialogues(path, config.route_names, config.requests.harness_tags)


def _conversation_report(config: RouterConfig, classifier, dialogues, vectors, static=None) -> dict:
    """Per user turn, routed with the turns before it, as the router routes it (`static`: as _report's)."""
    from esr_tuning.conversations import TurnTable, conversation_metrics, predict
    from esr_tuning.evaluation import evaluate

    table = TurnTable.of(dialogues)
    decisions = predict(config, classifier, dialogues, vectors, static)
    report = evaluate(table.labels, decisions, list(config.route_names), config.default_route.name)
    report["conversation"] = conversation_metrics(table, [d.route for d in decisions])
    if static is not None:
        _with_encoder_alone(report, config, table.labels, predict(config, classifier, dialogues, vectors))
    return report


def text_vectors(encoder, texts: list[str]) -> dict:
    return dict(zip(texts, encoder.encode(texts)))


def _guard_data(config: RouterConfig, path: Path):
    from esr_tuning.guard import is_guard_data, load_guard_data

    with _data_errors(OSError, ValueError):
        return load_guard_data(path, config.requests) if is_guard_data(path) else None


def _guard_settings(config: RouterConfig):
    from filters.builtin import PromptGuard, PromptGuardSettings
    from esr_settings import build

    raw = config.filter_settings.get(PromptGuard.name)
    return build(PromptGuardSettings, raw, f"filter_settings.{PromptGuard.name}") if raw else None


def piece_vectors(encoder, requests) -> dict:
    from esr_tuning.guard import guard_texts

    return text_vectors(encoder, guard_texts(requests))


def _guard_scorer(settings, encoder):
    """The served guard's scorer (filters.builtin.guard_scorer), on the offline encoder."""
    from filters.builtin import guard_scorer

    async def embed(text: str, deadline: float):
        return encoder.encode([text])[0]

    return asyncio.run(guard_scorer(settings, embed))


def cmd_eval_guard(args: argparse.Namespace, config: RouterConfig, requests) -> int:
    from esr_tuning.guard import format_guard_report, guard_report, request_scores, screened

    settings = _guard_settings(config)
    if settings is None or "prompt_guard" not in config.filters:
        print("guard data needs a config whose filters include prompt_guard (filter_settings.prompt_guard)",
              file=sys.stderr)
        return 2
    encoder, _ = offline(config)
    cleared = None
    if settings.static_screen is not None:  # as the served guard screens: on the static tier this config serves
        from filters.builtin import screen_embedding

        cleared = screened(settings.static_screen, screen_embedding(settings.static_screen, static_tier(config)),
                           requests)
    report = guard_report(requests, request_scores(_guard_scorer(settings, encoder), requests,
                                                   piece_vectors(encoder, requests)), settings.threshold, cleared)
    print(json.dumps(report) if args.json else format_guard_report(report))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from esr_tuning.conversations import routed_texts
    from esr_tuning.evaluation import format_report, routed_texts_of

    config = load_or_exit(args.config)
    page = {}
    guard = _guard_data(config, args.data)
    if guard is not None:
        return cmd_eval_guard(args, config, guard)
    if _is_conversations(args.data):
        dialogues = _dialogues(config, args.data)
        encoder, classifier = offline(config)
        report = _conversation_report(config, classifier, dialogues, text_vectors(encoder, routed_texts(config, dialogues)),
                                      static_tier(config))
    else:
        data = _labelled(config, args.data)
        encoder, classifier = offline(config)
        embeddings = encoder.encode(routed_texts_of(config, data.texts))
        report = _report(classifier, embeddings, data, config, static_tier(config))
        semantic = _semantic_cache_report(config, classifier, encoder, data, embeddings)
        if semantic is not None:
            report["cache"] = semantic
        page = {"scores": classifier.scores(embeddings)[:, : len(config.routes)], "labels": data.labels,
                "routes": [r.name for r in config.routes], "thresholds": classifier.thresholds}
    print(json.dumps(report) if args.json else format_report(report, config.default_route.name))
    if args.html:
        from esr_tuning.report_html import render

        args.html.write_text(render(report, f"{args.config.name} on {args.data.name}", **page), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from esr_tuning.jsonl import BadRecord
    from esr_tuning.replay import format_report, read_records, replay, report

    config = load_or_exit(args.config)
    with _data_errors(OSError, BadRecord):
        records, left_out = read_records(args.records)
    if not records:
        print(f"data error: {args.records} holds no decision routing made with its texts recorded "
              f"(records.prompts: true); left out: {dict(left_out)}", file=sys.stderr)
        return 2
    encoder, classifier = offline(config)
    texts = sorted({t for r in records for t in r.texts})
    decisions = replay(config, classifier, static_tier(config), records, text_vectors(encoder, texts) if texts else {})
    out = report(config, records, decisions, left_out)
    print(json.dumps(out) if args.json else format_report(out))
    over = (args.max_changed is not None and out["changed_share"] > args.max_changed) or (
        args.max_cost_change is not None and out["cost_change"] is not None
        and abs(out["cost_change"]) > args.max_cost_change)
    return 3 if over else 0


def _is_conversations(path: Path) -> bool:
    from esr_tuning.conversations import is_conversation_data

    with _data_errors(OSError):
        return is_conversation_data(path)


def _finetune(config: RouterConfig, data, args: argparse.Namespace) -> RouterConfig:
    """The config with its encoder fine-tuned on `data` (esr_tuning/finetune.py), saved beside --out."""
    import logging

    from esr_app.placement import runtime
    from esr_model.encoder import resolve_device
    from esr_model.location import resolve_model
    from esr_tuning.finetune import FinetuneSettings, finetune

    logging.getLogger("esr_tuning.finetune").setLevel(logging.INFO)  # progress, every 50 steps
    default = config.default_route.name
    keep = [i for i, label in enumerate(data.labels) if label != default]
    classes = data.intents or data.labels
    out_dir = args.out.with_suffix(".model")
    with _data_errors(ValueError):
        info = finetune(resolve_model(config.encoder.model), resolve_device(config.encoder.device),
                        [data.texts[i] for i in keep], [classes[i] for i in keep], out_dir,
                        FinetuneSettings(epochs=args.finetune_epochs))
    print(f"fine-tuned {config.encoder.model} on {len(keep)} in-scope examples of {info['classes']} classes: "
          f"{info['steps']} steps of {info['batch']} pairs in {info['seconds']} s on {info['device']}; saved to {out_dir}")
    tuned = replace_at(config, "encoder", model=str(out_dir.resolve()))
    if runtime(tuned) == "onnx":  # served (and scored below) on its export, made here where torch is
        from esr_model.export import ensure_export

        print(f"exported to ONNX: {ensure_export(str(out_dir))[0]}")
    return tuned


def cmd_fit_guard(args: argparse.Namespace, config: RouterConfig, requests) -> int:
    """The prompt guard fitted on guard data: a head (--head) or the config's exemplars, and the
    threshold for --guard-fpr; written into the config's prompt_guard settings (added to the chain)."""

    from esr_tuning.guard import fit_guard, format_guard_report

    settings = _guard_settings(config)
    if not args.head and (settings is None or not settings.exemplars):
        print("fit on guard data trains a head (--head) or tunes the threshold of filter_settings.prompt_guard.exemplars; "
              "the config has neither", file=sys.stderr)
        return 2
    encoder, _ = offline(config)
    vectors = piece_vectors(encoder, requests)
    exemplars = None if args.head else _guard_scorer(settings, encoder)
    # A head gets a static screen where a static tier serves this config (the screen reads its embedding).
    tier = static_tier(config) if args.head else None
    static = tier.embedding if tier is not None else None
    with _data_errors(ValueError):
        result = fit_guard(requests, vectors, exemplars, args.head, args.guard_fpr, static=static)
    guard = {**(config.filter_settings.get("prompt_guard") or {}), "threshold": round(result.threshold, 6)}
    guard.pop("static_screen", None)  # fitted on the old head's split: never kept beside a new head
    if result.head is not None:
        guard["head"] = {"weights": list(result.head.weights), "bias": result.head.bias}
    if result.screen is not None:
        screen = result.screen
        guard["static_screen"] = {"weights": list(screen.weights), "bias": screen.bias,
                                  "below": screen.below, "table": screen.table}
    elif args.head and tier is None:
        print("no static screen: no static tier serves this config")
    filters = config.filters if "prompt_guard" in config.filters else ("prompt_guard", *config.filters)
    fitted = dataclasses.replace(config, filters=filters, filter_settings={**config.filter_settings, "prompt_guard": guard})
    write_config(fitted, args.out, leading_comments(args.config))
    for note in result.notes:
        print(note)
    print(format_guard_report(result.held_out))
    print(f"wrote {args.out}")
    return 0


def _fit_static_tier(result, classifier, encoder, embeddings, texts: list[str], labels, intents, **head_tier):
    """The cascade's first tier fitted to the fitted encoder's decisions (esr_tuning/static_fit.py).
    -> the result with it in its config and notes, the StaticFit (its head, None: a similarity
    config's; its trained table rows), and the tier as the server would run it."""
    from esr_tuning.evaluation import routed_texts_of
    from esr_tuning.static_fit import cleared, fit_head_tier, fit_similarity_tier
    from router.static_tier import StaticTier

    static = static_embedding(cleared(result.config))  # the distilled table: a head config's rows train over it
    encode = static.encode
    routed = routed_texts_of(result.config, texts)
    if result.config.classifier.method == "head":
        fitted = fit_head_tier(result.config, classifier, embeddings, routed, labels, intents, static, **head_tier)
        encode = (fitted.embedding or static).encode
    else:
        fitted = fit_similarity_tier(result.config, encoder.encode, encode, routed, head_tier.get("overall"),
                                     head_tier.get("requests"))
    result = dataclasses.replace(result, config=fitted.config, notes=result.notes + fitted.notes)
    tier = StaticTier(fitted.config, encode, fitted.head)
    return result, fitted, tier


def _with_heads(config: RouterConfig, out: Path, head, static=None) -> RouterConfig:
    """`config` naming what fit trained, each saved beside `out`: the encoder's head, and the static
    tier's head and table rows (`static`: a StaticFit; None, or None in it: none trained)."""
    from esr_model.static_embedding import save_trained

    for trained, suffix, key in ((head, ".head.npz", "classifier.head_path"),
                                 (static and static.head, ".static-head.npz", "static_tier.head_path")):
        if trained is not None:
            path = out.with_suffix(suffix)
            trained.save(path)
            config = replace_at(config, key, str(path.resolve()))
    if static is not None and static.table is not None:
        path = out.with_suffix(".static-table.npz")
        save_trained(path, static.table.rows, static.table.vectors, static.table.source)
        config = replace_at(config, "static_tier.table_path", str(path.resolve()))
    return config


def _fit_static_only(args: argparse.Namespace, config: RouterConfig) -> int:
    from esr_tuning.evaluation import routed_texts_of
    from esr_tuning.fit import FitResult
    from esr_tuning.jsonl import read_records

    if not static_tier_on(config):
        print("--static-only: static_tier.enabled is off for this config", file=sys.stderr)
        return 2
    if config.classifier.method == "head":
        data = _labelled(config, args.data)
        texts, labels, intents = data.texts, data.labels, data.intents
    else:
        with _data_errors(OSError, ValueError):
            texts = read_records(args.data, lambda r: str(r["text"]), '{"text": ...}', "texts")
        labels = intents = None
    encoder, classifier = offline(config)
    embeddings = encoder.encode(routed_texts_of(config, texts))
    result, static, _ = _fit_static_tier(FitResult(config, None, []), classifier, encoder, embeddings, texts, labels,
                                         intents)
    write_config(_with_heads(result.config, args.out, None, static), args.out, leading_comments(args.config))
    for note in result.notes:
        print(note)
    print(f"wrote {args.out}")
    return 0


def _fit_from_records(args: argparse.Namespace, config: RouterConfig) -> int:
    """The static tier refitted on recorded traffic, labelled by the config's encoder (esr_tuning/
    records_fit.py); the encoder and its thresholds stay as they are. Judged on held-out records."""
    from esr_tuning.evaluation import routed_texts_of
    from esr_tuning.fit import FitResult
    from esr_tuning.records_fit import STATIC_HIDDEN, format_judged, held_out, judged, route_distribution, teaching
    from esr_tuning.replay import read_records

    if not static_tier_on(config):
        print("--from-records refits the static tier: static_tier.enabled is off for this config", file=sys.stderr)
        return 2
    if not 0.0 < args.held_out < 1.0 or not 0.0 <= args.max_disagreement < 1.0:
        print("--held-out must be between 0 and 1, --max-disagreement at least 0 and below 1", file=sys.stderr)
        return 2
    records = []
    left_out: Counter = Counter()
    for path in args.from_records:
        with _data_errors(OSError, ValueError):
            found, skipped = read_records(path, lenient=True)
        records += found
        left_out += skipped
    labelled = _labelled(config, args.data) if args.data else None
    labelled_texts = routed_texts_of(config, labelled.texts) if labelled else []
    teach, judge = held_out(records, args.held_out, labelled_texts)
    if len(teach) < 50 or len(judge) < 20:
        print(f"--from-records: {len(records)} replayable records ({len(teach)} to learn from, {len(judge)} held out); "
              "at least 50 and 20 are needed (records.prompts must be on)", file=sys.stderr)
        return 2
    encoder, classifier = offline(config)
    vectors = text_vectors(encoder, list(dict.fromkeys([t for r in records for t in r.texts] + labelled_texts)))
    before = judged(config, classifier, static_tier(config), judge, vectors)
    taught = teaching(config, classifier, teach, vectors, labelled_texts)
    texts, labels = taught.texts + labelled_texts, taught.labels + (labelled.labels if labelled else [])
    if len({label for label in labels if label != config.default_route.name}) < 2:
        print(f"--from-records: the records teach {len(taught.texts)} examples of "
              f"{len(set(taught.labels))} route(s) ({dict(taught.counts)}); the static tier needs two routes or more",
              file=sys.stderr)
        return 2
    embeddings = np.stack([vectors[t] for t in texts])
    # A head config's static head learns the encoder's route distribution through a hidden layer,
    # over the table as distilled (docs/notes/benchmarks-history.md has the figures that chose each).
    tier_options: dict = {"overall": args.max_disagreement, "requests": taught.followups}
    if config.classifier.method == "head":
        tier_options |= dict(hidden=STATIC_HIDDEN, train_rows=False, teacher=route_distribution(classifier, embeddings))
    result, fitted, tier = _fit_static_tier(FitResult(config, None, []), classifier, encoder, embeddings, texts,
                                            labels, None, **tier_options)
    after = judged(result.config, classifier, tier, judge, vectors)
    write_config(_with_heads(result.config, args.out, None, fitted), args.out, leading_comments(args.config))
    print(f"records: {len(records)} replayable ({len(teach)} to learn from, {len(judge)} held out); "
          + ", ".join(f"{k} {v}" for k, v in sorted((taught.counts + left_out).items())))
    for note in result.notes:
        print(note)
    print(format_judged(before, after))
    if args.report:
        args.report.write_text(json.dumps({"before": before, "after": after, "counts": dict(taught.counts)},
                                               indent=1))
    print(f"wrote {args.out}")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:

    from router.classifier import RouteClassifier
    from esr_tuning.evaluation import routed_texts_of
    from esr_tuning.fit import fit

    from esr_tuning.evaluation import SHIFTED_DEFAULT_SHARE
    from esr_tuning.fit import OBJECTIVES

    if args.objective not in OBJECTIVES:
        print(f"fit: --objective must be one of {', '.join(OBJECTIVES)}, got {args.objective!r}", file=sys.stderr)
        return 2
    if args.confidence_default_share is None:
        args.confidence_default_share = SHIFTED_DEFAULT_SHARE
    config = load_or_exit(args.config)
    guard = _guard_data(config, args.data) if args.data is not None else None
    if guard is not None:
        return cmd_fit_guard(args, config, guard)
    if args.from_records:
        return _fit_from_records(args, config)
    if args.data is None:
        print("fit: --data is required (labelled JSONL), unless --from-records", file=sys.stderr)
        return 2
    if args.static_only:
        return _fit_static_only(args, config)
    static_fit = None  # the cascade's first tier, where fit fits one (its head and table rows are saved)
    options = dict(with_head=args.head, tune_top_k=args.top_k, objective=args.objective,
                   min_default_recall=args.min_default_recall, per_route=not args.shared_threshold,
                   head_score=None if args.head_score == "auto" else args.head_score,
                   calibration_share=args.confidence_default_share)
    if _is_conversations(args.data):
        from esr_tuning.conversations import fit_conversations, routed_texts, with_gate

        if args.finetune:
            print("--finetune takes {text, label} data: a conversation's turns are no examples of their route",
                  file=sys.stderr)
            return 2

        config = with_gate(config, config.conversation.gate)  # a gate is fitted for the track policy
        dialogues = _dialogues(config, args.data)
        encoder, classifier = offline(config)
        vectors = text_vectors(encoder, routed_texts(config, dialogues))
        before = _conversation_report(config, classifier, dialogues, vectors)
        result = fit_conversations(config, encoder.encode, dialogues, vectors, **options)
        fitted_classifier = RouteClassifier(result.config, encoder.encode, head=result.head)
        static = None
        if static_tier_on(result.config):
            from esr_tuning.static_fit import cleared, fit_conversation_tier
            from router.static_tier import StaticTier

            embedding = static_embedding(cleared(result.config))
            static_fit = fit_conversation_tier(result.config, fitted_classifier, embedding, dialogues, vectors)
            result = dataclasses.replace(result, config=static_fit.config, notes=result.notes + static_fit.notes)
            static = StaticTier(static_fit.config, (static_fit.embedding or embedding).encode, static_fit.head)
        after = _conversation_report(result.config, fitted_classifier, dialogues, vectors, static)
    else:
        data = _labelled(config, args.data)
        encoder, classifier = offline(config)
        embeddings = encoder.encode(routed_texts_of(config, data.texts))
        before = _report(classifier, embeddings, data, config)
        if args.finetune:
            config = _finetune(config, data, args)
            encoder, _ = offline(config)
            embeddings = encoder.encode(routed_texts_of(config, data.texts))
        result = fit(config, encoder.encode, embeddings, data.labels, intents=data.intents if args.head else None,
                     **options)
        fitted_classifier = RouteClassifier(result.config, encoder.encode, head=result.head)
        static = None
        if static_tier_on(result.config):
            result, static_fit, static = _fit_static_tier(result, fitted_classifier, encoder, embeddings, data.texts,
                                                          data.labels, data.intents if args.head else None)
        after = _report(fitted_classifier, embeddings, data, result.config, static)
        semantic = _semantic_cache_report(result.config, fitted_classifier, encoder, data, embeddings)
        if semantic is not None:
            # Each semantic route's threshold: the lowest that keeps its false hits in bounds here.
            result.notes.append(f"response cache: semantic thresholds {semantic['tuned_thresholds']} "
                                f"(false hits at most {semantic['max_false_share']:.1%} of a route's requests)")
            tuned = {**result.config.cache.semantic_thresholds, **semantic["tuned_thresholds"]}
            result = dataclasses.replace(result, config=replace_at(result.config, "cache", semantic_thresholds=tuned))

    head_file = args.out.with_suffix(".head.npz")
    write_config(_with_heads(result.config, args.out, result.head, static_fit), args.out, leading_comments(args.config))

    for note in result.notes:
        print(note)
    print(f"{'on ' + str(args.data):<40}{'before':>10}{'after':>10}")
    rows = [(key, before[key], after[key]) for key in ("accuracy", "in_scope_accuracy", "default_recall")]
    if before.get("shifted") and after.get("shifted"):
        rows.append((f"accuracy_at_{before['shifted']['default_share']:.0%}_default", before["shifted"]["accuracy"],
                     after["shifted"]["accuracy"]))
    if "conversation" in before:
        rows += [(key, before["conversation"][key], after["conversation"][key])
                 for key in ("all_turns", "short_followups", "topic_changes")]
    if before.get("confidence") and after.get("confidence"):
        rows += [(f"confidence_{key}", before["confidence"][key], after["confidence"][key]) for key in ("ece", "auroc")]
    for key, old, new in rows:
        print(f"{key:<40}{old if old is not None else '-':>10}{new if new is not None else '-':>10}")
    print(f"wrote {args.out}" + (f" and {head_file}" if result.head is not None else ""))
    return 0
