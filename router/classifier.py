"""Picks a route for a prompt embedding, with a scoring strategy: utterance similarity or a trained head."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from router.calibration import Calibrator, features, kind_of
from router.config import RoutingConfig
from router.conversation import deciding_turn
from router.head import HeadScorer, LinearHead, train_head
from router.similarity import Encode, SimilarityScorer


@dataclass(frozen=True)
class Decision:
    route: str
    model: str
    score: float
    reason: str  # matched | context | default | low_confidence | keyword | rule | model_pinned | fallback_* | ...
    # The probability that the route is right (router/calibration.py); 1.0 where nothing was
    # guessed (a pinned model, a keyword, a rule), the default route's prior on a fallback.
    confidence: float = 1.0
    # Which tier's model decided (router/static_tier.py: static or encoder); "" where none did.
    tier: str = ""
    # Set by the model choice (router/capabilities.py): the models Envoy tries in turn, `model`
    # first, where there are two or more; the route's models passed over, as "model:capability".
    chain: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    # Set by selection (router/selection.py), where it chose among the route's models: the chosen
    # model's predicted score and its price.
    predicted_quality: float | None = None
    price: float | None = None
    selection_id: str | None = None  # where selection feedback is on: what an evaluator scores the answer by


ENCODER = "encoder"  # the tier a RouteClassifier decides as, unless told otherwise (router/static_tier.py)


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

    def __init__(self, config: RoutingConfig, encode: Encode, head: LinearHead | None = None, tier: str = ENCODER):
        """`tier`: what its decisions' `tier` says (x-semantic-route-tier)."""
        self.config = config
        self.tier = tier
        self.routes = config.routes
        self.thresholds = np.asarray([config.threshold_of(r) for r in self.routes], dtype=np.float32)
        self.thresholds.flags.writeable = False  # choose_one reads them as floats
        self._threshold_values = self.thresholds.tolist()
        self.scorer, self.has_default_class = _scorer(config, encode, head)
        self.calibrator = Calibrator(config.calibration)
        self._min_confidence = [config.min_confidence_of(r) for r in self.routes]

    @property
    def head(self) -> LinearHead | None:
        """The trained head it scores with (classifier.method: head), loaded or trained at load; else None."""
        return self.scorer.head if isinstance(self.scorer, HeadScorer) else None

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

    def choose_one(self, row: np.ndarray) -> int:
        """`choose` for one row of `scores` (the classifier's own thresholds), in Python floats: a
        request's decision on the event loop costs numpy's calls over ten values, not arithmetic.
        The same answer: the row's float32 values compare exactly as float64."""
        values = row.tolist()
        best, idx = -math.inf, -1
        for i, (value, floor) in enumerate(zip(values, self._threshold_values)):
            if value >= floor and value > best:  # the first of equal scores, as argmax
                best, idx = value, i
        if not math.isfinite(best) or (self.has_default_class and values[-1] > best):
            return -1
        return idx

    def decision(self, row: np.ndarray, idx: int, kind: str = "matched") -> Decision:
        """The decision for one row of `scores` and its choice (as `choose` gives it); `kind`:
        matched (the request's own turn), or context (an earlier turn of its conversation)."""
        n = len(self.routes)
        reason = "default"
        if idx >= 0:
            route = self.routes[idx]
            confidence = self.calibrator.confidence(kind, features(row, idx, n, self.has_default_class),
                                                    float(self.thresholds[idx]))
            floor = self._min_confidence[idx]
            if floor is None or confidence >= floor:
                return Decision(route.name, route.model, float(row[idx]), kind, confidence, self.tier)
            reason = "low_confidence"
        x = features(row, -1, n, self.has_default_class)
        d = self.config.default_route
        score = float(row[-1] if self.has_default_class else row[:n].max())
        return Decision(d.name, d.model, score, reason, self.calibrator.confidence("default", x, 0.0), self.tier)

    def conversation_decision(self, scores: np.ndarray, gate: float | None) -> Decision:
        """The decision for one request's routed texts (rows of `scores`, oldest first): the
        server's and eval's one way to make it (router/conversation.py)."""
        turn, choice = deciding_turn(self, scores, gate)
        return self.decision(scores[turn], choice, kind_of(choice, turn == len(scores) - 1))

    def classify(self, embedding: np.ndarray) -> Decision:
        return self.classify_many(embedding[None, :])[0]

    def classify_many(self, embeddings: np.ndarray) -> list[Decision]:
        scores = self.scores(embeddings)
        return [self.decision(row, int(i)) for row, i in zip(scores, self.choose(scores))]

    def default(self, reason: str) -> Decision:
        """The default route without a look at any score (a fallback, no prompt, an unread body)."""
        d = self.config.default_route
        return Decision(d.name, d.model, 0.0, reason, self.calibrator.fallback())


def _scorer(config: RoutingConfig, encode: Encode, head: LinearHead | None) -> tuple[Scorer, bool]:
    """The configured strategy, and whether it scores the default route as a class of its own."""
    names = config.route_names
    default = config.default_route
    cc = config.classifier
    groups = [r.utterances for r in config.routes] + ([default.utterances] if default.utterances else [])
    modelled = [n for n, g in zip(names, groups) if g]  # routes with utterances; the rest only rules reach
    if cc.method == "head":
        if head is None and cc.head_path:
            head = LinearHead.load(cc.head_path)
            dimension = encode([next(u for g in groups for u in g)]).shape[1]
            if head.dimension != dimension:  # a head fitted on another encoder's embeddings
                raise ValueError(f"classifier.head_path: the head takes {head.dimension}-dimension embeddings; "
                                 f"the encoder gives {dimension}")
        if head is None:  # trained on the config's own utterances at load
            labels = [n for n, g in zip(names, groups) for _ in g]
            head = train_head(encode([u for g in groups for u in g]), labels, modelled, epochs=cc.head_epochs)
        scored = names if default.name in head.routes else names[:-1]
        required = [n for n in modelled if n != default.name or default.name in head.routes]
        return HeadScorer(head, scored, cc.head_score, required), len(scored) == len(names)
    return SimilarityScorer(groups, encode, cc.top_k, cc.aggregation), bool(default.utterances)
