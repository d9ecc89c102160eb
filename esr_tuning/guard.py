"""The prompt guard measured and fitted on labelled data: recall, false positives per request, a threshold.

Data: JSONL lines of one of
  {"text": ..., "label": "block" | "allow", "category": ...}        one request of one user message
  {"messages": [...], "label": "block" | "allow", "category": ...}   one request of these messages
  {"messages": [...], "labels": ["block" | "allow", ...]}            one request per user turn: the
                                                                       messages up to it, labelled alike
A request is read as the served guard reads it (router.guard_pieces: every role, in
pieces) and scored by router.guard.GuardScorer: its highest piece. Since the guard reads every turn,
one benign turn scored above the threshold blocks every later request of its conversation: the
false-positive rate here is per request, with those later requests counted.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from router.guard_pieces import guard_pieces
from router.config import RequestsConfig
from router.guard import GuardHead, GuardScorer, StaticScreen
from esr_tuning.jsonl import BadRecord, first_record, read_records

LABELS = ("block", "allow")
PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class GuardRequest:
    pieces: tuple[str, ...]
    blocked: bool  # labelled block
    category: str
    group: int  # the record it came from (a conversation's requests share one)
    text: str  # what a head learns from: the user's own text (a turn, or the record's text)


def is_guard_data(path: str | Path) -> bool:
    row = first_record(path)
    if not isinstance(row, dict):
        return False
    labels = row.get("labels") if "labels" in row else [row.get("label")]
    return isinstance(labels, list) and bool(labels) and all(label in LABELS for label in labels)


def load_guard_data(path: str | Path, policy: RequestsConfig) -> list[GuardRequest]:
    def label_of(value) -> bool:
        if value not in LABELS:
            raise BadRecord(f"label must be block or allow, got {value!r}")
        return value == "block"

    def parse(row: dict) -> list[tuple[dict, bool, str]]:
        """(the request's body, blocked, the user's own text) per request of a record."""
        if "text" in row:
            return [({"messages": [{"role": "user", "content": str(row["text"])}]}, label_of(row["label"]),
                     str(row["text"]))]
        messages = row["messages"]
        if "labels" not in row:
            return [({"messages": messages}, label_of(row["label"]), str(messages[-1]["content"]))]
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if len(row["labels"]) != len(users):
            raise BadRecord(f"{len(row['labels'])} labels for {len(users)} user messages")
        return [({"messages": messages[: i + 1]}, label_of(label), str(messages[i]["content"]))
                for i, label in zip(users, row["labels"])]

    def category(row: dict) -> str:
        return str(row.get("category", "-"))

    records = read_records(path, lambda row: (category(row), parse(row)),
                           '{"text", "label": "block"|"allow"} or {"messages", "label"/"labels"}', "guard examples")
    out = [GuardRequest(guard_pieces(body, PATH, policy), blocked, kind, group, text)
           for group, (kind, requests) in enumerate(records) for body, blocked, text in requests]
    return [r for r in out if r.pieces]


def request_scores(scorer: GuardScorer, requests: Sequence[GuardRequest], vectors: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray([scorer.score(np.stack([vectors[p] for p in r.pieces])) for r in requests])


def guard_report(requests: Sequence[GuardRequest], scores: np.ndarray, threshold: float,
                 cleared: np.ndarray | None = None) -> dict:
    """Recall on blocked requests and false-positive rate on allowed ones, overall and per category;
    `cleared`: the requests a static screen let on (never flagged), whose share is reported too."""
    flagged = scores >= threshold
    if cleared is not None:
        flagged = flagged & ~cleared
    blocked = np.asarray([r.blocked for r in requests])
    categories = np.asarray([r.category for r in requests])

    def share(mask: np.ndarray) -> float | None:
        return round(float(flagged[mask].mean()), 4) if mask.any() else None

    per_category = {}
    for category in sorted(set(categories)):
        mask = categories == category
        per_category[category] = {"requests": int(mask.sum()), "blocked_label": bool(blocked[mask].all()),
                                  "flagged": share(mask)}
    report = {"threshold": round(float(threshold), 4), "requests": len(requests), "recall": share(blocked),
              "false_positive_rate": share(~blocked), "blocked_requests": int(blocked.sum()),
              "allowed_requests": int((~blocked).sum()), "per_category": per_category}
    if cleared is not None:
        report["screened"] = round(float(cleared.mean()), 4) if len(requests) else None
    return report


def threshold_for(allowed_scores: np.ndarray, target_fpr: float) -> float:
    """The lowest threshold at which at most `target_fpr` of the allowed requests score at or above it."""
    ranked = np.sort(allowed_scores)[::-1]
    k = int(np.floor(target_fpr * len(ranked)))  # this many may be flagged
    if k >= len(ranked):
        return float(ranked[-1])
    return float(np.nextafter(np.float32(ranked[k]), np.float32(np.inf)))


def split_groups(requests: Sequence[GuardRequest], holdout: float, seed: int) -> tuple[list[int], list[int]]:
    """Request indices of a train / held-out split by record, stratified by label and category."""
    by_stratum: dict[tuple, dict[int, None]] = defaultdict(dict)  # groups in order of first sight, once
    for r in requests:
        by_stratum[(r.blocked, r.category)][r.group] = None
    rng = np.random.default_rng(seed)
    held: set[int] = set()
    for key in sorted(by_stratum, key=str):
        groups = list(by_stratum[key])
        rng.shuffle(groups)
        held.update(groups[: int(round(len(groups) * holdout))])
    train = [i for i, r in enumerate(requests) if r.group not in held]
    test = [i for i, r in enumerate(requests) if r.group in held]
    return train, test


def guard_texts(requests: Sequence[GuardRequest]) -> list[str]:
    """Every text a guard fit reads the embedding of: each request's pieces (what is scored) and its
    whole text (a blocked request's is the head's positive example)."""
    return sorted({p for r in requests for p in r.pieces} | {r.text for r in requests})


def train_guard_head(requests: Sequence[GuardRequest], vectors: dict[str, np.ndarray], seed: int = 0) -> GuardHead:
    """A logistic head: blocked requests' own texts against every piece of the allowed ones (what it
    will score when serving), the two sides weighted alike."""
    from router.head import train_head

    positives = sorted({r.text for r in requests if r.blocked})
    negatives = sorted({p for r in requests if not r.blocked for p in r.pieces} - set(positives))
    x = np.stack([vectors[t] for t in positives + negatives])
    head = train_head(x, ["block"] * len(positives) + ["allow"] * len(negatives), ["allow", "block"], seed=seed)
    weights = head.weight[1] - head.weight[0]
    return GuardHead(tuple(round(float(w), 6) for w in weights), round(float(head.bias[1] - head.bias[0]), 6))


# The static screen's bar, as a share of the lowest static score among the held-out attacks the
# guard catches. Measured with each of bastioncorpus's 7 attack categories left out of the fit in
# turn: at 0.2 none of the left-out attacks the guard caught was cleared (at 0.5, 2 categories lost
# recall; at 1.0, 4 did, 0.09 of the mean), and 52% of CLINC150 val and SGD dev requests were
# (python -m bench.guard.guard_screen; docs/static-tier.md#the-guards-static-screen).
SCREEN_MARGIN = 0.2


def screened(screen: StaticScreen | None, encode, requests: Sequence[GuardRequest]) -> np.ndarray:
    """Which requests the screen lets on without the encoder, as the served guard decides."""
    if screen is None or encode is None:
        return np.zeros(len(requests), dtype=bool)
    return np.asarray([screen.clears(encode, r.pieces) for r in requests], dtype=bool)


@dataclass
class GuardFit:
    head: GuardHead | None
    threshold: float
    held_out: dict
    notes: list[str]
    screen: StaticScreen | None = None


def static_head(requests: Sequence[GuardRequest], train: Sequence[int], static,
                seed: int = 0) -> tuple[GuardHead, dict[str, np.ndarray]]:
    """The screen's head: a guard head on `static`'s vectors (a StaticEncoder), trained on the guard
    head's split; and those vectors, for every text of `requests`."""
    texts = guard_texts(requests)
    vectors = dict(zip(texts, static.encode(texts)))
    return train_guard_head([requests[i] for i in train], vectors, seed), vectors


def screen_with(head: GuardHead, vectors: dict[str, np.ndarray], requests: Sequence[GuardRequest],
                held: Sequence[int], caught: np.ndarray, static,
                margin: float = SCREEN_MARGIN) -> tuple[StaticScreen | None, str]:
    """The static screen of `head`, its bar `margin` times the lowest static score of the held-out
    attacks in `caught` (those the guard catches); None where none is caught."""
    if not caught.any():
        return None, "no static screen: the guard catches no held-out attack to set its bar under"
    scores = request_scores(GuardScorer(head=head), [requests[i] for i in held], vectors)
    screen = StaticScreen(head.weights, head.bias, float(margin * scores[caught].min()), static.digest)
    allowed = [requests[i] for i in held if not requests[i].blocked]
    cleared = screened(screen, static.encode, allowed)
    return screen, (f"static screen: clears {cleared.mean():.1%} of the {len(allowed)} held-out allowed requests "
                    f"without the encoder, no held-out attack the guard catches (bar {screen.below:.4g})")


def fit_guard(requests: Sequence[GuardRequest], vectors: dict[str, np.ndarray], exemplars: GuardScorer | None,
              with_head: bool, target_fpr: float, holdout: float = 0.2, seed: int = 0, static=None) -> GuardFit:
    """A head (with_head) trained on a split of the records, or the config's exemplars (their scorer);
    the threshold for `target_fpr` false positives per allowed request on the held-out records, and
    what it catches there. `static`: the static tier's embedding (a StaticEncoder), to fit the
    head's static screen on (static_head, screen_with)."""
    train, test = split_groups(requests, holdout, seed)
    head = train_guard_head([requests[i] for i in train], vectors, seed) if with_head else None
    scorer = GuardScorer(head=head) if head is not None else exemplars
    if scorer is None:
        raise ValueError("the guard needs exemplars or a head to score with")
    held = [requests[i] for i in test]
    scores = request_scores(scorer, held, vectors)
    allowed = scores[~np.asarray([r.blocked for r in held])]
    threshold = threshold_for(allowed, target_fpr) if allowed.size else 0.5
    report = guard_report(held, scores, threshold)
    notes = [f"guard {'head trained on ' + str(len(train)) + ' requests' if with_head else 'exemplars'}; "
             f"threshold {report['threshold']} for {target_fpr:.1%} false positives on {len(held)} held-out requests: "
             f"recall {report['recall']}, false-positive rate {report['false_positive_rate']}"]
    screen = None
    if with_head and static is not None:
        caught = np.asarray([r.blocked for r in held]) & (scores >= threshold)
        screen, note = screen_with(*static_head(requests, train, static, seed), requests, test, caught, static)
        notes.append(note)
    return GuardFit(head, threshold, report, notes, screen)


def format_guard_report(report: dict) -> str:
    lines = [f"threshold {report['threshold']}: recall {report['recall']} of {report['blocked_requests']} blocked "
             f"requests, false-positive rate {report['false_positive_rate']} of {report['allowed_requests']} allowed "
             "(per request)", f"{'category':<32}{'requests':>10}{'label':>8}{'flagged':>10}"]
    if report.get("screened") is not None:
        lines.insert(1, f"static screen: {report['screened']:.1%} of requests let on without the encoder")
    for name, c in report["per_category"].items():
        lines.append(f"{name:<32}{c['requests']:>10}{'block' if c['blocked_label'] else 'allow':>8}"
                     f"{c['flagged'] if c['flagged'] is not None else '-':>10}")
    return "\n".join(lines)
