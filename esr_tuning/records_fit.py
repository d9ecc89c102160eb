"""Turns decision records (with texts) into the static tier's teaching: each recorded request labelled
by the decision the config's encoder makes on it now, a held-out share kept apart to judge the refit.

The encoder decides each record again (replay's code, the static tier off) rather than the record's
own route being believed: a record the static tier decided, or one made under an older config, would
otherwise teach the tier its own or a stale answer. A conversation's record teaches its newest turn
only where the encoder gives that turn alone the conversation's route (the static tier decides on
the newest turn's own lead; a follow-up routed by its context is no example of its route).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from esr_config import RouterConfig
from esr_tuning.replay import Recorded, replay
from esr_tuning.static_fit import WholeRequests
from router.classifier import RouteClassifier
from router.static_tier import StaticTier

# The static head's hidden units where it learns from records (a head config's): a linear head over the
# static embedding follows a few-shot encoder's decisions too loosely, a deeper one trains too long for a
# nightly refit (docs/notes/benchmarks-history.md, "the heads tried").
STATIC_HIDDEN = 512
# Reasons the classifier (either tier) decided: rules, a keyword and the rest are not the tier's to learn.
CLASSIFIED = frozenset({"matched", "context", "default", "low_confidence"})


@dataclass(frozen=True)
class Taught:
    texts: list[str]  # as routed, one per example
    labels: list[str]  # the encoder's route for each
    counts: Counter  # records taught, and why the others were not
    followups: WholeRequests  # the records routed by their context: what the margins must also hold on


def held_out(records: Sequence[Recorded], share: float, labelled: Sequence[str] = ()
             ) -> tuple[list[Recorded], list[Recorded]]:
    """(records to teach, records to judge by): a record's side is fixed by a hash of its newest text
    (the one it teaches), so a later refit on a grown file judges by the same records it judged by
    before, and a prompt never sits on both sides, alone or as a conversation's turn. A record of a
    `labelled` text is never judged by: the fit learnt it."""
    known = set(labelled)
    teach: list[Recorded] = []
    judge: list[Recorded] = []
    for r in records:
        newest = r.texts[-1] if r.texts else ""
        if newest in known:
            teach.append(r)
            continue
        digest = hashlib.blake2b(newest.encode("utf-8", "replace"), digest_size=8).digest()
        (judge if int.from_bytes(digest, "big") / 2**64 < share else teach).append(r)
    return teach, judge


def teaching(config: RouterConfig, classifier: RouteClassifier, records: Sequence[Recorded],
             vectors: dict[str, np.ndarray], labelled: Sequence[str] = ()) -> Taught:
    """The examples `records` give the static tier; `labelled`: texts a team labelled, whose label
    stands (their records are not taught again)."""
    known = set(labelled)
    texts: list[str] = []
    labels: list[str] = []
    counts: Counter = Counter()
    seen: set[str] = set()
    followups: list[tuple[str, ...]] = []
    their_routes: list[str] = []
    for record, decision in zip(records, replay(config, classifier, None, records, vectors)):
        if record.reason not in CLASSIFIED or decision.reason not in CLASSIFIED or not record.texts:
            counts["decided_by_rules"] += 1
            continue
        text = record.texts[-1]
        if text in known:
            counts["labelled_already"] += 1
            continue
        if len(record.texts) > 1:
            alone = classifier.conversation_decision(classifier.scores(vectors[text][None, :]), config.conversation.gate)
            if alone.route != decision.route:
                counts["routed_by_context"] += 1
                followups.append(tuple(record.texts))
                their_routes.append(decision.route)
                continue
        if text in seen:
            counts["repeated"] += 1
            continue
        seen.add(text)
        texts.append(text)
        labels.append(decision.route)
        counts["taught"] += 1
    return Taught(texts, labels, counts, WholeRequests(followups, their_routes))


def route_distribution(classifier: RouteClassifier, embeddings: np.ndarray) -> np.ndarray | None:
    """(n, routes): the encoder head's probability of each route (its classes' summed), the teacher
    a static head learns from besides the decision; None for a classifier without a head."""
    head = classifier.head
    if head is None:
        return None
    logits = head.logits(embeddings)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    names = [r.name for r in classifier.routes]
    out = np.zeros((len(embeddings), len(names)), dtype=np.float32)
    for column, route in enumerate(head.routes):
        if route in names:
            out[:, names.index(route)] += probs[:, column]
    return out


def judged(config: RouterConfig, classifier: RouteClassifier, static: StaticTier | None,
           records: Sequence[Recorded], vectors: dict[str, np.ndarray]) -> dict:
    """On records the refit did not learn from: the share of the classifier's decisions the static
    tier takes, and per route how often the cascade's decision is the encoder's alone."""
    mine = [r for r in records if r.reason in CLASSIFIED and r.texts]
    alone = replay(config, classifier, None, mine, vectors)
    cascade = replay(config, classifier, static, mine, vectors)
    kept = [(a, c) for a, c in zip(alone, cascade) if a.reason in CLASSIFIED]
    per_route: dict[str, dict] = {}
    for name in config.route_names:
        of = [(a, c) for a, c in kept if a.route == name]
        statically = [(a, c) for a, c in of if c.tier == "static"]
        per_route[name] = {
            "requests": len(of),
            "static_share": round(len(statically) / len(of), 4) if of else None,
            "agreement": round(sum(a.route == c.route for a, c in of) / len(of), 4) if of else None,
            "static_agreement": (round(sum(a.route == c.route for a, c in statically) / len(statically), 4)
                                 if statically else None),
        }
    n = len(kept)
    return {
        "records": n,
        "static_share": round(sum(c.tier == "static" for _, c in kept) / n, 4) if n else None,
        "agreement": round(sum(a.route == c.route for a, c in kept) / n, 4) if n else None,
        "routes": per_route,
    }


def format_judged(before: dict, after: dict) -> str:
    lines = [f"on {after['records']} held-out records{'':<10}{'before':>10}{'after':>10}",
             f"{'static share':<40}{_cell(before['static_share'])}{_cell(after['static_share'])}",
             f"{'agreement with the encoder':<40}{_cell(before['agreement'])}{_cell(after['agreement'])}",
             f"{'route':<24}{'requests':>8}{'static':>8}{'agrees':>8}"]
    for name, row in after["routes"].items():
        lines.append(f"{name:<24}{row['requests']:>8}{_cell(row['static_share'], 8)}{_cell(row['agreement'], 8)}")
    return "\n".join(lines)


def _cell(value, width: int = 10) -> str:
    return f"{'-' if value is None else f'{value:.4f}':>{width}}"
