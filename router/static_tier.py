"""The cascade's first tier: routes a request on a static embedding (esr_model/static_embedding.py)
when it chooses a route and leads the runner-up by that route's `accept` margin (and, where fit set
`min_similarity`, the prompt lies near something its head was taught); else (the default route
included) it leaves the request to the encoder.

It scores exactly as the encoder's classifier does (the same method, conversation policy and
decision), on static vectors: a head of its own, or the utterances embedded statically. Its work is
a tokenization and a gather per turn, bounded by the request reader's cut, so it runs on the event
loop: a decided request costs microseconds and never waits in the batcher's queue.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from router.classifier import ENCODER, Decision, RouteClassifier
from router.config import RoutingConfig
from router.conversation import deciding_turn
from router.head import LinearHead

STATIC = "static"  # x-semantic-route-tier: which tier decided (the other: classifier.ENCODER)
_ABSENT = -1e9  # a route's score where it has none (-inf: only rules reach it), as margins and lead read it
__all__ = ["ENCODER", "STATIC", "StaticTier", "lead", "margins", "own_turn_lead", "prototype_similarity", "route_accepts",
           "static_classifier", "static_config"]


def static_config(config: RoutingConfig) -> RoutingConfig:
    """`config` as the static tier scores it: its thresholds and head in place of the encoder's."""
    st = config.static_tier
    routes = tuple(dataclasses.replace(r, threshold=st.thresholds.get(r.name, config.threshold_of(r)))
                   for r in config.routes)
    classifier = dataclasses.replace(config.classifier, head_path=st.head_path)
    return dataclasses.replace(config, routes=routes, classifier=classifier)


def static_classifier(config: RoutingConfig, encode: Callable[[Sequence[str]], np.ndarray],
                      head: LinearHead | None = None) -> RouteClassifier:
    """The static tier's classifier for `config` (its decisions say tier static); `head`: a static
    head already trained (fit), else static_tier.head_path's, else trained on the utterances."""
    return RouteClassifier(static_config(config), encode, head=head, tier=STATIC)


def own_turn_lead(classifier: RouteClassifier, scores: np.ndarray, gate: float | None) -> tuple[int, float]:
    """For one request's routed texts (rows of `scores`, oldest first): the route the static tier
    would decide, and by how much it leads (margins); -1 where it leaves the request to the encoder
    whatever the margin: the default route, or a route carried from an earlier turn (whether the
    request's own turn names nothing or a new topic is the encoder's call: static context decisions
    cost the cascade accuracy, docs/notes/static-tier-history.md). Serving and fit apply the same
    rule through this."""
    turn, choice = deciding_turn(classifier, scores, gate)
    if choice < 0 or turn != len(scores) - 1:
        return -1, 0.0
    return choice, lead(classifier, scores[turn], choice)


def lead(classifier: RouteClassifier, row: np.ndarray, choice: int) -> float:
    """`margins` of one row and the route it chose, in Python floats (the loop decides one request
    at a time): the same subtraction, in the row's precision, of the same operands."""
    values = row.tolist()
    n = len(classifier.routes)
    routes = [v if math.isfinite(v) else _ABSENT for v in values[:n]]
    runner_up = max((v for i, v in enumerate(routes) if i != choice), default=_ABSENT)
    if classifier.has_default_class:
        runner_up = values[-1] if math.isnan(values[-1]) else max(runner_up, values[-1])  # as np.maximum
    exact = row.dtype.type  # the row's own precision, as numpy subtracts
    return float(exact(routes[choice]) - exact(runner_up))


def margins(classifier: RouteClassifier, scores: np.ndarray, choices: np.ndarray,
            thresholds: np.ndarray | None = None) -> np.ndarray:
    """How far each row's choice leads: a route's score over the best other column (the default
    route's included when it is a class); for the default route, how far the best route falls
    below its threshold (`thresholds`, default the classifier's), or the default column's lead
    when that is larger."""
    thresholds = classifier.thresholds if thresholds is None else thresholds
    n = len(classifier.routes)
    routes = np.where(np.isfinite(scores[:, :n]), scores[:, :n], _ABSENT)
    rows = np.arange(len(scores))
    chosen = np.maximum(choices, 0)
    others = routes.copy()
    others[rows, chosen] = _ABSENT
    runner_up = others.max(axis=1)
    if classifier.has_default_class:
        runner_up = np.maximum(runner_up, scores[:, -1])
    lead = routes[rows, chosen] - runner_up
    below = (thresholds[None, :] - routes).min(axis=1)
    if classifier.has_default_class:
        below = np.maximum(below, scores[:, -1] - routes.max(axis=1))
    return np.where(choices >= 0, lead, below)


def route_accepts(config: RoutingConfig) -> np.ndarray:
    """Each route's `static_tier.accept` margin, in route order; a route not named: inf (the encoder's)."""
    return np.asarray([config.static_tier.accept.get(r.name, np.inf) for r in config.routes], dtype=np.float32)


def prototype_similarity(prototypes: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """How near each static vector (a row, or one vector) lies to the nearest class prototype: what
    `min_similarity` bounds. Serving and fit's cut (esr_tuning/static_fit.py) both read it here."""
    return (vectors @ prototypes.T).max(axis=-1)


class StaticTier:
    def __init__(self, config: RoutingConfig, encode: Callable[[Sequence[str]], np.ndarray],
                 head: LinearHead | None = None):
        """`encode`: the static embedding (StaticEncoder.encode); `head`: as static_classifier's
        (a head trained at load needs torch)."""
        self.encode = encode
        self.classifier = static_classifier(config, encode, head)
        # A route with no fitted margin is the encoder's. The default route always is: telling a
        # prompt that belongs nowhere from one the static head knows too little of is what the
        # transformer is for (static default decisions were far less often right than the encoder's:
        # docs/benchmarks.md, "The cascade"); own_turn_lead never offers it.
        self.accept = route_accepts(config).tolist()  # read as floats, as own_turn_lead's lead is
        self.gate = config.conversation.gate
        self.fallback_guess = config.static_tier.fallback == "guess"
        self.default_route = config.default_route.name
        # The in-scope check: the head's class prototypes, and how near one a prompt must lie.
        self.in_scope: tuple[np.ndarray, float] | None = None
        floor = config.static_tier.min_similarity
        if floor is not None:
            prototypes = self.classifier.head.prototypes if self.classifier.head is not None else None
            if prototypes is None:
                raise ValueError("static_tier.min_similarity: the static head has no class prototypes to compare "
                                 "with (semantic-router fit saves them with the head it trains)")
            self.in_scope = (prototypes, floor)

    @property
    def embedding(self):
        """The static embedding behind `encode` (a StaticEncoder; None for a bare function): the
        table the guard's screen must have been fitted on, and its digest."""
        return getattr(self.encode, "__self__", None)

    def decide(self, turns: Sequence[str]) -> Decision | None:
        """The decision on the request's routed texts (oldest first), or None: the encoder decides."""
        return self.weigh(turns)[0]

    def weigh(self, turns: Sequence[str]) -> tuple[Decision | None, Decision | None, np.ndarray]:
        """decide's answer; the route the tier would choose all the same, were the encoder to fail
        it (None where that is the default route, or the config routes no fallback by it); and the
        request's own turn's static vector (what model selection predicts from where the tier decides)."""
        vectors = self.encode(turns)
        scores = self.classifier.scores(vectors)
        choice, lead = own_turn_lead(self.classifier, scores, self.gate)
        if choice >= 0 and lead >= self.accept[choice] and self._near_enough(vectors[-1]):
            decided = self.classifier.decision(scores[-1], choice, "matched")
            return decided, decided, vectors[-1]
        if not self.fallback_guess:
            return None, None, vectors[-1]
        guess = self.classifier.conversation_decision(scores, self.gate)
        return None, (None if guess.route == self.default_route else guess), vectors[-1]

    def _near_enough(self, vector: np.ndarray) -> bool:
        if self.in_scope is None:
            return True
        prototypes, floor = self.in_scope
        return float(prototype_similarity(prototypes, vector)) >= floor
