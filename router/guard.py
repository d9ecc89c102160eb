"""Scores a request's text pieces for the prompt guard: the highest piece decides.

Two methods on the shared embedding: similarity to blocked exemplars (the highest cosine), or a
linear head fitted by `semantic-router fit` on labelled guard data (the probability a piece is an
attack). Before them, a static screen may clear a request on the static tier's embedding. The filter
(filters/builtin.PromptGuard) and `eval`/`fit` score with this.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

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


# The most the screen embeds on the event loop for one request; a request with more goes to the
# encoder, as without a screen. Each piece costs the loop its tokens, a gather and a mean, so the
# bounds keep a request's screen well under a millisecond, at the price of leaving a long
# conversation's many pieces to the encoder (docs/static-tier.md#the-guards-static-screen; the
# cost at these bounds and the share screened within them: docs/notes/static-tier-history.md).
SCREEN_MAX_PIECES = 16
SCREEN_MAX_CHARS = 2048


@dataclass(frozen=True)
class StaticScreen:
    """Lets a request on without the encoder where every piece scores below `below` on a logistic
    head over the static tier's embedding (`fit` trains it beside the guard's head, on the same
    split, and sets `below` well under every held-out attack the guard catches). It only ever
    clears: what it does not clear the guard scores as before. `table`: what identifies the static
    table the head was fitted on (StaticEncoder.digest); served over another, the screen is off."""

    weights: tuple[float, ...]
    bias: float
    below: float
    table: str

    def __post_init__(self):
        GuardHead(self.weights, self.bias)  # the same checks
        if not 0.0 < self.below < 1.0:
            raise SettingError("below", "must be a probability between 0 and 1")
        if not self.table:
            raise SettingError("table", "must name the static table the screen was fitted on")

    @functools.cached_property
    def _scorer(self) -> GuardScorer:
        return GuardScorer(head=GuardHead(self.weights, self.bias))

    @property
    def dimension(self) -> int:
        return len(self.weights)

    def clears(self, encode: Callable[[Sequence[str]], np.ndarray], pieces: Sequence[str]) -> bool:
        """Whether the request of these pieces is let on unexamined by the encoder; `encode`: the
        static embedding. Never for more than SCREEN_MAX_PIECES pieces or SCREEN_MAX_CHARS of text."""
        if not pieces or len(pieces) > SCREEN_MAX_PIECES or sum(len(p) for p in pieces) > SCREEN_MAX_CHARS:
            return False
        return self._scorer.score(encode(pieces)) < self.below
