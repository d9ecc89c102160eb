"""Which user turn of a conversation sets its route: the most recent decisive one.

A follow-up such as "Yes, that sounds good." names no topic: its best route wins weakly or not at
all, so it keeps the route of the turn before it. A turn that names a topic clearly wins with a
high score and switches. Scored turn by turn, this needs nothing remembered between requests: each
request carries its conversation, and the embedding cache makes the earlier turns free.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class Chooser(Protocol):
    """What a turn's choice is read from: the route classifier (router/classifier.py), which calls
    deciding_turn itself."""

    @property
    def routes(self) -> Sequence[object]: ...

    @property
    def has_default_class(self) -> bool: ...

    def choose_one(self, row: np.ndarray) -> int: ...

    def choose(self, scores: np.ndarray) -> np.ndarray: ...


def deciding_turn(classifier: Chooser, scores: np.ndarray, gate: float | None) -> tuple[int, int]:
    """For one conversation's turns (rows of `scores`, oldest first): the turn that sets the route
    and its choice (route index, -1 the default route). That turn is the last decisive one; with
    none, the most confident (its own choice, often the default route)."""
    if len(scores) == 1:  # one turn sets it whether decisive or not: its own choice (most requests)
        return 0, classifier.choose_one(scores[0])
    choice, decisive = _decisive(classifier, scores, gate)
    hits = np.flatnonzero(decisive)
    turn = int(hits[-1]) if hits.size else int(np.argmax(scores.max(axis=1)))
    return turn, int(choice[turn])


def _decisive(classifier: Chooser, scores: np.ndarray, gate: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Each turn's own choice, and whether it is decisive.

    Decisive: a route won with at least `gate` (and its threshold), or the default route's own
    examples scored above every route and at least `gate`. Without a gate, winning is enough; a
    turn that falls to the default route only because no route cleared its threshold never is.
    """
    choice = classifier.choose(scores)
    rows = np.arange(len(choice))
    n_routes = len(classifier.routes)
    won = np.where(choice >= 0, scores[rows, np.maximum(choice, 0)], -np.inf)
    if classifier.has_default_class:
        won = np.where(choice < 0, _default_win(scores, n_routes), won)
    decisive = np.isfinite(won) & (won >= (gate if gate is not None else -np.inf))
    return choice, decisive


def _default_win(scores: np.ndarray, n_routes: int) -> np.ndarray:
    """The default class's score where it beat every route, cleared or not; -inf elsewhere (the
    default route came only from nothing clearing)."""
    default = scores[:, -1]
    return np.where(default > scores[:, :n_routes].max(axis=1), default, -np.inf)
