"""Picks a route for a prompt embedding: utterance similarity (top-k) or a trained linear head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from router.config import RouterConfig
from router.head import LinearHead, train_head

Encode = Callable[[Sequence[str]], np.ndarray]


@dataclass(frozen=True)
class Decision:
    route: str
    model: str
    score: float
    reason: str  # matched | default | model_pinned | fallback_* | ...


class RouteClassifier:
    """Scores every route (and, when it has examples, the default route) for an embedding.

    The best route whose score clears its threshold wins, unless the default route's own
    examples score higher; otherwise the default route. Scores are cosine similarities for
    `similarity` and probabilities for `head`, and thresholds are on that scale.
    """

    def __init__(self, config: RouterConfig, encode: Encode, head: LinearHead | None = None):
        self.config = config
        self.routes = config.routes
        self.has_default_class = bool(config.default_route.utterances)
        groups = [r.utterances for r in self.routes]
        if self.has_default_class:
            groups.append(config.default_route.utterances)
        self.thresholds = np.asarray([config.threshold_of(r) for r in self.routes], dtype=np.float32)
        cc = config.classifier
        self.method = cc.method
        if cc.method == "head":
            self.head = head or self._load_or_train_head(encode, groups)
            self.has_default_class = config.default_route.name in self.head.routes
            self._head_routes = [r.name for r in self.routes]
            if self.has_default_class:
                self._head_routes.append(config.default_route.name)
            if set(self.head.routes) != set(self._head_routes):
                raise ValueError(
                    f"classifier.head_path: head routes {sorted(set(self.head.routes))} do not match {sorted(self._head_routes)}"
                )
        else:
            texts = [u for g in groups for u in g]
            self._matrix = np.ascontiguousarray(encode(texts), dtype=np.float32)
            sizes = [len(g) for g in groups]
            self._starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
            self._sizes = sizes
            self._top_k = cc.top_k
            self._mean = cc.aggregation == "mean" and cc.top_k > 1

    def _load_or_train_head(self, encode: Encode, groups: list[tuple[str, ...]]) -> LinearHead:
        cc = self.config.classifier
        if cc.head_path:
            return LinearHead.load(cc.head_path)
        names = [r.name for r in self.routes] + ([self.config.default_route.name] if self.has_default_class else [])
        texts = [u for g in groups for u in g]
        labels = [n for n, g in zip(names, groups) for _ in g]
        return train_head(encode(texts), labels, names, epochs=cc.head_epochs)

    # -- scoring ---------------------------------------------------------------------------

    def scores(self, embeddings: np.ndarray) -> np.ndarray:
        """(n, groups): one column per route, plus the default route's last when it has examples."""
        if self.method == "head":
            return self.head.route_scores(embeddings, self._head_routes)
        sims = embeddings @ self._matrix.T
        if self._top_k == 1:
            return np.maximum.reduceat(sims, self._starts, axis=1)
        cols = []
        for start, size in zip(self._starts, self._sizes):
            block = sims[:, start : start + size]
            k = min(self._top_k, size)
            top = -np.partition(-block, k - 1, axis=1)[:, :k]
            cols.append(top.mean(axis=1) if self._mean else top.max(axis=1))
        return np.stack(cols, axis=1)

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

    def _decision(self, row: np.ndarray, idx: int) -> Decision:
        if idx < 0:
            return self.default("default", float(row[-1] if self.has_default_class else row[: len(self.routes)].max()))
        route = self.routes[idx]
        return Decision(route.name, route.model, float(row[idx]), "matched")

    def classify(self, embedding: np.ndarray) -> Decision:
        return self.classify_many(embedding[None, :])[0]

    def classify_many(self, embeddings: np.ndarray) -> list[Decision]:
        scores = self.scores(embeddings)
        return [self._decision(row, int(i)) for row, i in zip(scores, self.choose(scores))]

    def default(self, reason: str, score: float = 0.0) -> Decision:
        d = self.config.default_route
        return Decision(d.name, d.model, score, reason)
