"""Replays decision records through a candidate config: every recorded request that routing decided
is decided again by the code `eval` uses (rules, the static tier, the classifier on the texts it was
routed on, under the conversation's gate), and the report says what would change: decisions moved
between routes, each model's share of the traffic, its cost at the config's `prices`, confidence, and
where selection chooses models, what it spends and the scores it predicts."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from esr_config import RouterConfig
from esr_tuning.decide import decide_requests
from esr_tuning.jsonl import BadRecord
from router.classifier import Decision, RouteClassifier
from router.rules import RequestFacts
from router.static_tier import StaticTier

# Reasons routing itself decided: the others (a pinned model, a fallback, a body not read) are not
# the routes' doing, and a config change would not move them.
REDECIDED = frozenset({"matched", "context", "default", "low_confidence", "keyword", "rule", "no_prompt", "no_capable_model"})


MOVED_SHOWN = 20  # records named in the table report; --json names every one


@dataclass(frozen=True)
class Recorded:
    texts: tuple[str, ...]
    facts: RequestFacts
    route: str
    model: str
    reason: str
    confidence: float
    line: int = 0  # where in its file (1-based): how a report names the record
    trace_id: str | None = None
    price: float | None = None  # where selection chose: the chosen model's price and predicted score
    predicted_quality: float | None = None


def read_records(path: str | Path, lenient: bool = False) -> tuple[list[Recorded], Counter]:
    """The replayable records of a decision-record file, and why the others are left out.
    `lenient`: a line that is not a record (cut short by a full disk, say) is counted `malformed`
    and skipped, not an error (a refit learns from what is there; a gate refuses)."""
    out: list[Recorded] = []
    left_out: Counter = Counter()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if row.get("kind") == "score":  # a score selection feedback took (select-fit --records)
                    left_out["score"] += 1
                    continue
                reason = row["reason"]
                if "blocked" in row:
                    left_out["blocked"] += 1
                elif reason not in REDECIDED or "unread" in row:
                    left_out[reason] += 1
                elif not row.get("texts") and reason != "no_prompt":
                    left_out["no_texts"] += 1  # recorded without records.prompts
                else:
                    facts = row.get("facts") or {}
                    out.append(Recorded(tuple(row.get("texts") or ()),
                                        RequestFacts(int(facts.get("prompt_tokens", 0)), bool(facts.get("tools")),
                                                     bool(facts.get("images")), int(facts.get("max_tokens", 0)),
                                                     bool(facts.get("structured")), bool(facts.get("stream"))),
                                        str(row["route"]), str(row["model"]), reason, float(row["confidence"]),
                                        n, row.get("trace_id") if isinstance(row.get("trace_id"), str) else None,
                                        _number(row.get("price")), _number(row.get("predicted_quality"))))
            except (ValueError, KeyError, TypeError) as exc:
                if lenient:
                    left_out["malformed"] += 1
                    continue
                raise BadRecord(f"{path}:{n}: not a decision record ({type(exc).__name__}: {exc})") from None
    return out, left_out


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _selection(records: Sequence[Recorded], decisions: Sequence[Decision]) -> dict:
    """What selection spends and predicts, as served (the records) and as the candidate would: the
    chosen models' prices summed and their predicted scores' mean, over the requests selection chose
    for (a served figure includes feedback's corrections and exploration; a replayed one does not)."""
    def summary(prices: list[float | None], quality: list[float | None]) -> tuple[float | None, float | None]:
        spent = [p for p in prices if p is not None]
        predicted = [q for q in quality if q is not None]
        return (round(sum(spent), 6) if spent else None,
                round(float(np.mean(predicted)), 4) if predicted else None)

    spend_before, quality_before = summary([r.price for r in records], [r.predicted_quality for r in records])
    spend_after, quality_after = summary([d.price for d in decisions], [d.predicted_quality for d in decisions])
    if spend_before is None and spend_after is None:
        return {}
    return {"selected_spend_before": spend_before, "selected_spend_after": spend_after,
            "selected_quality_before": quality_before, "selected_quality_after": quality_after,
            "selected_before": sum(r.price is not None for r in records),
            "selected_after": sum(d.price is not None for d in decisions)}


def replay(config: RouterConfig, classifier: RouteClassifier, static: StaticTier | None, records: Sequence[Recorded],
           vectors: dict[str, np.ndarray]) -> list[Decision]:
    return decide_requests(config, classifier, [(r.texts, r.facts) for r in records], vectors, static)


def report(config: RouterConfig, records: Sequence[Recorded], decisions: Sequence[Decision], left_out: Counter) -> dict:
    moved = Counter((r.route, d.route) for r, d in zip(records, decisions) if r.route != d.route)
    n = len(records)

    def shares(models: list[str]) -> dict[str, float]:
        return {m: round(c / n, 4) for m, c in sorted(Counter(models).items())} if n else {}

    def cost(models: list[str]) -> float | None:
        if not config.prices:
            return None
        return round(sum(config.prices.get(m, 0.0) * r.facts.prompt_tokens / 1e6 for m, r in zip(models, records)), 6)

    before, after = [r.model for r in records], [d.model for d in decisions]
    cost_before, cost_after = cost(before), cost(after)
    return {
        "records": n,
        "left_out": dict(sorted(left_out.items())),
        "changed": sum(moved.values()),
        "changed_share": round(sum(moved.values()) / n, 4) if n else 0.0,
        "moved": [{"from": a, "to": b, "requests": c} for (a, b), c in sorted(moved.items(), key=lambda kv: -kv[1])],
        # Each record that moves, by its line in the file (and trace, where it has one): a reviewer
        # reads those records, not a count.
        "moved_records": [{"line": r.line, "trace_id": r.trace_id, "from": r.route, "to": d.route,
                           "reason": d.reason} for r, d in zip(records, decisions) if r.route != d.route],
        "models_before": shares(before),
        "models_after": shares(after),
        "cost_before": cost_before,
        "cost_after": cost_after,
        "cost_change": (round((cost_after - cost_before) / cost_before, 4)
                        if cost_before and cost_after is not None else None),
        "mean_confidence_before": round(float(np.mean([r.confidence for r in records])), 4) if n else None,
        "mean_confidence_after": round(float(np.mean([d.confidence for d in decisions])), 4) if n else None,
        **_selection(records, decisions),
    }


def format_report(out: dict) -> str:
    lines = [f"replayed {out['records']} recorded decisions; left out: "
             + (", ".join(f"{k} {v}" for k, v in out["left_out"].items()) or "none"),
             f"changed: {out['changed']} ({100 * out['changed_share']:.2f}%)"]
    if out["moved"]:
        lines.append(f"{'from':<20} {'to':<20} {'requests':>8}")
        lines += [f"{m['from']:<20} {m['to']:<20} {m['requests']:>8}" for m in out["moved"]]
        shown = out["moved_records"][:MOVED_SHOWN]
        lines.append("records that move (line: from -> to): " + ", ".join(
            f"{m['line']}: {m['from']} -> {m['to']}" for m in shown)
            + (f", and {len(out['moved_records']) - len(shown)} more (--json lists all)"
               if len(out["moved_records"]) > len(shown) else ""))
    lines.append(f"{'model':<24} {'before':>8} {'after':>8}")
    for model in sorted(set(out["models_before"]) | set(out["models_after"])):
        lines.append(f"{model:<24} {out['models_before'].get(model, 0):>8.4f} {out['models_after'].get(model, 0):>8.4f}")
    if out["cost_before"] is not None:
        change = "" if out["cost_change"] is None else f" ({100 * out['cost_change']:+.2f}%)"
        lines.append(f"prompt cost: {out['cost_before']:.6f} -> {out['cost_after']:.6f}{change}")
    if "selected_spend_before" in out:
        def shown(value):
            return "none" if value is None else f"{value:.4f}"
        lines.append(f"selection: {out['selected_before']} -> {out['selected_after']} requests chosen for, spend "
                     f"{shown(out['selected_spend_before'])} -> {shown(out['selected_spend_after'])}, mean predicted "
                     f"score {shown(out['selected_quality_before'])} -> {shown(out['selected_quality_after'])}")
    if out["mean_confidence_before"] is not None:
        lines.append(f"mean confidence: {out['mean_confidence_before']:.4f} -> {out['mean_confidence_after']:.4f}")
    return "\n".join(lines)
