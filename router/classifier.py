"""Picks a route for a prompt embedding, with a scoring strategy: utterance similarity or a trained head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from router.config import RouterConfig
from router.head import HeadScorer, LinearHead, train_head
from router.similarity import Encode, SimilarityScorer


@dataclass(frozen=True)
class Decision:
    route: str
    model: str
    score: float
    reason: str  # matched | default | model_pinned | fallback_* | ...


class Scorer(Protocol):
    def scores(self, embeddings: np.ndarray) -> np.ndarray:
        """(n, columns): one column per route, then the default route's when it is scored."""
        ...


class RouteClassifier:
    """Scores every route (and, when it has examples, the default route) for an embedding.

    The best route whose score clears its threshold wins, unless the default route's own
    examples score higher; otherwise the default route. Scores are cosine similarities for
    `similarity` and probabilities or energies for `head` (classifier.head_score), and thresholds
    are on that scale.
    """

    def __init__(self, config: RouterConfig, encode: Encode, head: LinearHead | None = None):
        self.config = config
        self.routes = config.routes
        self.thresholds = np.asarray([config.threshold_of(r) for r in self.routes], dtype=np.float32)
        self.scorer, self.has_default_class = _scorer(config, encode, head)

    def scores(self, embeddings: np.ndarray) -> np.ndarray:
        """(n, groups): one column per route, plus the default route's last when it has examples."""
        return self.scorer.scores(embeddings)

    def choose(self, scores: np.ndarray, thresholds: np.ndarray | None = None) -> np.ndarray:
        """Route index per row of `scores`, or -1 for the default route (vectorised for eval/fit)."""
        thresholds = self.thresholds if thresholds is None else thresholds
        route_scores = scores[:, : len(self.routes)]
        cleared = np.where(route_scores >= thresholds, route_scores, -np.inf)
        idx = np.argmax(cleared, axis=1)
        best = cleared[np.arange(len(idx)), idx]
        unmatched = ~np.isfinite(best)
        if self.has_default_class:
            unmatched |= scores[:, -1] > best
        return np.where(unmatched, -1, idx)

    def decision(self, row: np.ndarray, idx: int) -> Decision:
        """The decision for one row of `scores` and its choice (as `choose` gives it)."""
        if idx < 0:
            return self.default("default", float(row[-1] if self.has_default_class else row[: len(self.routes)].max()))
        route = self.routes[idx]
        return Decision(route.name, route.model, float(row[idx]), "matched")

    def classify(self, embedding: np.ndarray) -> Decision:
        return self.classify_many(embedding[None, :])[0]

    def classify_many(self, embeddings: np.ndarray) -> list[Decision]:
        scores = self.scores(embeddings)
        return [self.decision(row, int(i)) for row, i in zip(scores, self.choose(scores))]

    def default(self, reason: str, score: float = 0.0) -> Decision:
        d = self.config.default_route
        return Decision(d.name, d.model, score, reason)


def _scorer(config: RouterConfig, encode: Encode, head: LinearHead | None) -> tuple[Scorer, bool]:
    """The configured strategy, and whether it scores the default route as a class of its own."""
    names = config.route_names
    default = config.default_route
    cc = config.classifier
    groups = [r.utterances for r in config.routes] + ([default.utterances] if default.utterances else [])
    if cc.method == "head":
        if head is None and cc.head_path:
            head = LinearHead.load(cc.head_path)
            dimension = encode([groups[0][0]]).shape[1]
            if head.weight.shape[1] != dimension:  # a head fitted on another encoder's embeddings
                raise ValueError(f"classifier.head_path: the head takes {head.weight.shape[1]}-dimension embeddings; "
                                 f"the encoder gives {dimension}")
        if head is None:  # trained on the config's own utterances at load
            labels = [n for n, g in zip(names, groups) for _ in g]
            head = train_head(encode([u for g in groups for u in g]), labels, names[: len(groups)],
                              epochs=cc.head_epochs)
        scored = names if default.name in head.routes else names[:-1]
        return HeadScorer(head, scored, cc.head_score), len(scored) == len(names)
    return SimilarityScorer(groups, encode, cc.top_k, cc.aggregation), bool(default.utterances)
