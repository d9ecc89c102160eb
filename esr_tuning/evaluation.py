"""Routing quality on labelled data: accuracy, per-route precision/recall/F1, confusion matrix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from router.llm_body import request_facts, texts_to_route
from router.classifier import Decision, RouteClassifier
from esr_config import RouterConfig
from router.rules import RequestFacts
from router.static_tier import ENCODER, STATIC, StaticTier
from esr_tuning.calibration import reliability, share_weights
from esr_tuning.decide import decide_requests
from esr_tuning.jsonl import known_label, read_records


@dataclass(frozen=True)
class LabelledData:
    texts: list[str]
    labels: list[str]
    intents: list[str] | None = None  # optional finer labels ("intent" key on every line)


def load_labelled(path: str | Path, allowed: Sequence[str]) -> LabelledData:
    """JSONL lines {"text": ..., "label": ...}; a label must be a route or the default route."""
    allowed_set = set(allowed)

    def parse(row: dict) -> tuple[str, str, object]:
        text, label = row["text"], row["label"]
        return str(text), known_label(label, allowed_set), row.get("intent")

    rows = read_records(path, parse, '{"text": ..., "label": ...}', "examples")
    texts, labels, intents = (list(column) for column in zip(*rows))
    have_intents = all(isinstance(i, str) for i in intents)
    return LabelledData(texts, labels, [str(i) for i in intents] if have_intents else None)


def routed_texts_of(config: RouterConfig, texts: Sequence[str]) -> list[str]:
    """What the router embeds for each text sent as a one-message request (capped as it caps it)."""
    return [(texts_to_route([t], None, config.requests, config.conversation.turns_read)[0] or (t,))[-1] for t in texts]


def one_message_facts(text: str) -> RequestFacts:
    """What rules and the model choice read of a request of that one user message."""
    return request_facts({"messages": [{"role": "user", "content": text}]}, "/v1/chat/completions")


def decide_labelled(config: RouterConfig, classifier: RouteClassifier, texts: Sequence[str],
                    embeddings: np.ndarray, static: StaticTier | None = None) -> list[Decision]:
    """Each text's decision as the router makes it for a request of that one user message
    (esr_tuning/decide.py: RoutingEngine.decide), `embeddings` being those of routed_texts_of;
    `static`: the cascade's first tier (None: off)."""
    routed = routed_texts_of(config, texts)
    return decide_requests(config, classifier, _one_message_requests(routed, texts), dict(zip(routed, embeddings)),
                           static)


def decide_without_encoder(config: RouterConfig, classifier: RouteClassifier, texts: Sequence[str],
                           static: StaticTier) -> list[Decision]:
    """Each text's decision, as decide_labelled's, were the encoder unable to answer (overloaded, its
    model process away): the rules, then the static tier where it stands, else the server's own
    fallback (RoutingEngine.fallback: the static tier's guess, or the default route)."""
    return decide_requests(config, classifier, _one_message_requests(routed_texts_of(config, texts), texts), {},
                           static)


def _one_message_requests(routed: Sequence[str], texts: Sequence[str]) -> list[tuple[list[str], RequestFacts]]:
    """Each text as a request of that one user message: its routed text, and what it asks of a model."""
    return [([r], one_message_facts(t)) for r, t in zip(routed, texts)]


# The default-route share the `shifted` figure (and fit's default objective) assumes: labelled sets hold a
# few percent of out-of-scope examples, production a fifth or more once a new kind of traffic arrives
# (CLINC150: val 3%, test 18%).
SHIFTED_DEFAULT_SHARE = 0.2


def shifted_accuracy(hit: np.ndarray, in_scope: np.ndarray, default_share: float) -> float:
    """Accuracy were `default_share` of the traffic the default route's: each side's hit rate,
    weighted (both sides must hold examples)."""
    return (1 - default_share) * float(hit[in_scope].mean()) + default_share * float(hit[~in_scope].mean())


def evaluate(labels: Sequence[str], decisions: Sequence[Decision], names: Sequence[str], default: str,
             default_share: float = SHIFTED_DEFAULT_SHARE) -> dict:
    """`names` lists every class in report order (routes, then the default route). `shifted`: the
    accuracy the same router would have if `default_share` of the traffic belonged to the default
    route (a labelled set rarely holds as much out-of-scope traffic as production sees after a shift).
    `confidence`: how well x-semantic-route-confidence is calibrated (ECE, 15 bins) and ranks (AUROC)."""
    y = np.asarray(labels)
    p = np.asarray([d.route for d in decisions])
    per_route = {}
    for name in names:
        tp = int(np.sum((p == name) & (y == name)))
        pred_n = int(np.sum(p == name))
        true_n = int(np.sum(y == name))
        precision = tp / pred_n if pred_n else 0.0
        recall = tp / true_n if true_n else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_route[name] = {"precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
                           "support": true_n}
    in_scope = y != default
    confusion = {t: {q: int(np.sum((y == t) & (p == q))) for q in names} for t in names}
    shifted = None
    if in_scope.any() and (~in_scope).any():
        shifted = {"default_share": default_share, "accuracy": round(shifted_accuracy(y == p, in_scope, default_share), 4)}
    return {
        "examples": len(y),
        "accuracy": round(float(np.mean(y == p)), 4),
        "in_scope_accuracy": round(float(np.mean(y[in_scope] == p[in_scope])), 4) if in_scope.any() else None,
        "default_recall": round(float(np.mean(p[~in_scope] == default)), 4) if (~in_scope).any() else None,
        "shifted": shifted,
        "per_route": per_route,
        "confusion": confusion,
        "confidence": _confidence(decisions, y == p, in_scope, default_share),
        "reasons": {r: int(n) for r, n in zip(*np.unique([d.reason for d in decisions], return_counts=True))},
        "tiers": _tiers(decisions, y == p, p, names),
    }


def _tiers(decisions: Sequence[Decision], right: np.ndarray, predicted: np.ndarray, names: Sequence[str]) -> dict | None:
    """Per cascade tier: the share of decisions it made, its accuracy and calibration on them, and
    its share of each route's decisions; None where no tier decided (rules only)."""
    tier = np.asarray([d.tier for d in decisions])
    if not (tier != "").any():
        return None
    confidence = np.asarray([d.confidence for d in decisions])
    out = {}
    for name in (STATIC, ENCODER):
        mine = tier == name
        out[name] = {
            "share": round(float(mine.mean()), 4),
            "accuracy": round(float(right[mine].mean()), 4) if mine.any() else None,
            "confidence": reliability(list(confidence[mine]), right[mine]) if mine.any() else None,
            "route_share": {r: round(float(mine[predicted == r].mean()), 4) for r in names if (predicted == r).any()},
        }
    return out


def _confidence(decisions: Sequence[Decision], right: np.ndarray, in_scope: np.ndarray, default_share: float) -> dict:
    """Reliability of the confidence on the data, and (`shifted`) with the default route's examples
    weighted to `default_share` of the whole, the mix fit calibrates for."""
    confidence = [d.confidence for d in decisions]
    report = reliability(confidence, right)
    if in_scope.any() and (~in_scope).any():
        shifted = reliability(confidence, right, weight=share_weights(in_scope, default_share))
        report["shifted"] = {"default_share": default_share, "ece": shifted["ece"]}
    return report


def format_report(report: dict, default: str) -> str:
    lines = [
        f"examples: {report['examples']}",
        f"accuracy: {report['accuracy']:.4f}",
        f"in-scope accuracy: {report['in_scope_accuracy']}",
        f"default-route ({default}) recall: {report['default_recall']}",
        *([f"accuracy with {report['shifted']['default_share']:.0%} default-route traffic: "
           f"{report['shifted']['accuracy']:.4f}"] if report.get("shifted") else []),
        *_conversation_lines(report.get("conversation")),
        *([f"encoder alone (static_tier off): accuracy {report['encoder_alone_accuracy']:.4f}"
           + (f", with {report['shifted']['default_share']:.0%} default-route traffic {report['encoder_alone_shifted']:.4f}"
              if report.get("encoder_alone_shifted") is not None and report.get("shifted") else "")]
          if report.get("encoder_alone_accuracy") is not None else []),
        *([f"encoder unavailable (every prompt the static tier leaves falls back): accuracy "
           f"{report['without_encoder']['guess']:.4f} routed by the static tier's guess, "
           f"{report['without_encoder']['default']:.4f} by the default route"] if report.get("without_encoder") else []),
        *([f"{name} tier: decides {t['share']:.1%}, accuracy {t['accuracy']}, ECE "
           f"{t['confidence']['ece'] if t['confidence'] else '-'}; share by route "
           + ", ".join(f"{r} {v:.0%}" for r, v in t["route_share"].items())
           for name, t in (report.get("tiers") or {}).items()]),
        *([f"confidence: ECE {report['confidence']['ece']:.4f} (15 bins), AUROC right vs wrong "
           f"{report['confidence']['auroc']}, mean {report['confidence']['mean_confidence']}"
           + (f"; ECE with {report['confidence']['shifted']['default_share']:.0%} default-route traffic "
              f"{report['confidence']['shifted']['ece']:.4f}" if report["confidence"].get("shifted") else "")]
          if report.get("confidence") else []),
        "",
        f"{'route':<24}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}",
    ]
    for name, m in report["per_route"].items():
        lines.append(f"{name:<24}{m['precision']:>10.4f}{m['recall']:>10.4f}{m['f1']:>10.4f}{m['support']:>10}")
    names = list(report["confusion"])
    short = [n[:8] for n in names]
    lines += ["", "confusion (rows: label, columns: predicted)", " " * 24 + "".join(f"{s:>9}" for s in short)]
    for name in names:
        lines.append(f"{name:<24}" + "".join(f"{report['confusion'][name][q]:>9}" for q in names))
    return "\n".join(lines)


def _conversation_lines(conversation: dict | None) -> list[str]:
    if conversation is None:
        return []
    return [
        f"per user turn ({conversation['turns']}): all turns {conversation['all_turns']}, "
        f"short follow-ups {conversation['short_followups']} ({conversation['short_followups_count']}), "
        f"topic changes {conversation['topic_changes']} ({conversation['topic_changes_count']})",
    ]
