"""Picks a route for a prompt embedding: cosine similarity to each route's utterances."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from router.config import RouterConfig


@dataclass(frozen=True)
class Decision:
    route: str
    model: str
    score: float
    reason: str  # matched | default | model_pinned | fallback_* | ...


class RouteClassifier:
    """Holds one normalised matrix of all utterance embeddings; a decision is one mat-vec."""

    def __init__(self, config: RouterConfig, encode: Callable[[Sequence[str]], np.ndarray]):
        self.config = config
        texts: list[str] = []
        owner: list[int] = []
        for idx, route in enumerate(config.routes):
            texts.extend(route.utterances)
            owner.extend([idx] * len(route.utterances))
        self._matrix = np.ascontiguousarray(encode(texts), dtype=np.float32)
        self._owner = np.asarray(owner)
        self._thresholds = np.asarray([config.threshold_of(r) for r in config.routes], dtype=np.float32)

    def default(self, reason: str, score: float = 0.0) -> Decision:
        d = self.config.default_route
        return Decision(d.name, d.model, score, reason)

    def route_scores(self, embedding: np.ndarray) -> np.ndarray:
        """Best utterance similarity per route, in config order."""
        sims = self._matrix @ embedding
        best = np.full(len(self.config.routes), -1.0, dtype=np.float32)
        np.maximum.at(best, self._owner, sims)
        return best

    def classify(self, embedding: np.ndarray) -> Decision:
        scores = self.route_scores(embedding)
        cleared = np.where(scores >= self._thresholds, scores, -np.inf)
        idx = int(np.argmax(cleared))
        if not np.isfinite(cleared[idx]):
            return self.default("default", float(scores.max()))
        route = self.config.routes[idx]
        return Decision(route.name, route.model, float(scores[idx]), "matched")
