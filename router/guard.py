"""Scores a request's text pieces for the prompt guard: the highest piece decides.

Two methods on the shared embedding: similarity to blocked exemplars (the highest cosine), or a
linear head fitted by `semantic-router fit` on labelled guard data (the probability a piece is an
attack). Both the filter (filters/builtin.PromptGuard) and `eval`/`fit` score with this.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from esr_settings import SettingError


@dataclass(frozen=True)
class GuardHead:
    """A logistic map over the embedding: P(block) = sigmoid(weights . embedding + bias)."""

    weights: tuple[float, ...]
    bias: float

    def __post_init__(self):
        if not self.weights or not all(np.isfinite(self.weights)) or not np.isfinite(self.bias):
            raise SettingError("weights", "must be finite numbers, one per embedding dimension")


class GuardScorer:
    def __init__(self, exemplars: np.ndarray | None = None, head: GuardHead | None = None):
        if head is None and exemplars is None:
            raise ValueError("the guard needs exemplars or a head")
        self._head = (np.asarray(head.weights, dtype=np.float32), np.float32(head.bias)) if head else None
        self._exemplars = exemplars if exemplars is not None else np.zeros((0, 0), np.float32)

    @property
    def dimension(self) -> int:
        return len(self._head[0]) if self._head is not None else self._exemplars.shape[1]

    def piece_scores(self, vectors: np.ndarray) -> np.ndarray:
        if self._head is not None:
            return 1.0 / (1.0 + np.exp(-np.clip(vectors @ self._head[0] + self._head[1], -50, 50)))
        return (vectors @ self._exemplars.T).max(axis=1)

    def score(self, vectors: np.ndarray) -> float:
        """A request's score: its highest piece's (an attack is not diluted by the text around it)."""
        return float(self.piece_scores(vectors).max())
