"""Which of a route's models serves a request, by predicted quality and price: a predictor of each
model's score from the request's embedding (fitted by `esr_tuning/selection_fit.py` on a team's eval
rows), each model's calibrated margin (so that "predicted to meet the floor" holds at a stated error
rate), and the team's policy.

Strategies, per request, among the models given (the route's capable ones):
- cheapest_meeting_floor: the cheapest whose prediction less its margin reaches `floor`; where none
  does, the one with the highest such bound;
- best_within_budget: the highest prediction among those priced within `budget`;
- utility: the highest prediction less `lam` x price (prices relative to the cheapest).

With feedback on (router/feedback.py), each prediction is first corrected by what scores said of
that route and model, and a small share of requests explores: another capable model goes first.
"""

from __future__ import annotations

import hmac
import os
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal

import numpy as np

from esr_settings import ConfigError
from router.feedback import FeedbackBook, Issued, SelectionIds

Strategy = Literal["cheapest_meeting_floor", "best_within_budget", "utility"]


@dataclass(frozen=True)
class QualityModel:
    """Predicted score per model: a linear map of the embedding (its last column the bias)."""

    models: tuple[str, ...]
    weights: np.ndarray  # (models, dimension + 1)
    margins: np.ndarray  # (models,): the prediction less this meets the true score at the fitted rate
    alpha: float  # that rate's complement: the share of predictions allowed to overstate by more
    # The same predictor over the static tier's vectors, for the requests it decides (None: those
    # keep the route's ranked order): selection then adds no transformer work to them.
    static: QualityModel | None = None

    def predict(self, vectors: np.ndarray) -> np.ndarray:
        """(n, models) predicted scores of `vectors` (n, dimension)."""
        return vectors @ self.weights[:, :-1].T + self.weights[:, -1]

    def require_dimension(self, dimension: int, path: str | None) -> None:
        """ConfigError, naming the key, where this reads embeddings of another size than the encoder's."""
        if self.weights.shape[1] != dimension + 1:
            raise ConfigError(f"selection.path: {path} reads embeddings of {self.weights.shape[1] - 1} dimensions, "
                              f"the encoder's have {dimension}: fit it again (semantic-router select-fit)")


FORMAT = 1


def save_quality(quality: QualityModel, path: str, encoder: str) -> None:
    """The quality model as one .npz; `encoder`: the model whose embeddings it reads."""
    arrays: dict[str, Any] = {"format": FORMAT, "models": np.asarray(quality.models), "weights": quality.weights,
                              "margins": quality.margins, "alpha": quality.alpha, "encoder": np.asarray(encoder)}
    if quality.static is not None:
        arrays.update(static_weights=quality.static.weights, static_margins=quality.static.margins)
    np.savez(path, **arrays)


def load_quality(path: str, dimension: int | None = None) -> QualityModel:
    """ConfigError, naming the key, for a file that is not one, or reads embeddings of another size."""
    try:
        with np.load(path, allow_pickle=False) as data:
            found = int(data["format"])
            models, alpha = tuple(str(m) for m in data["models"]), float(data["alpha"])
            static = QualityModel(models, data["static_weights"].astype(np.float32),
                                  data["static_margins"].astype(np.float32), alpha) if "static_weights" in data else None
            quality = QualityModel(models, data["weights"].astype(np.float32), data["margins"].astype(np.float32),
                                   alpha, static)
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"selection.path: {path} is not a quality model ({type(exc).__name__})") from None
    if found != FORMAT:
        raise ConfigError(f"selection.path: {path} is of format {found}, not {FORMAT}: fit it again")
    if dimension is not None:
        quality.require_dimension(dimension, path)
    return quality


@dataclass(frozen=True)
class Selected:
    """A request's models in the order selection puts them, and what it predicted of the first."""

    models: tuple[str, ...]
    quality: float
    price: float
    explored: bool = False  # the first model was drawn to earn scores, not ranked first
    selection_id: str | None = None  # where feedback is on: what an evaluator scores this request by


@dataclass
class Feedback:
    """What a selector needs of feedback: the corrections it applies, the ids it issues, how often it
    explores (and the draw that decides: random.random, or a test's)."""

    book: FeedbackBook
    ids: SelectionIds
    explore: float
    path: str  # where evaluators post scores
    token: bytes  # what they authenticate with (Authorization: Bearer ...)
    draw: Callable[[], float] = random.random
    source: tuple = ()  # (quality model, half-life, prior) the book's corrections are of
    # In a pool, what a posted score is claimed from before it is taken (a worker's model socket:
    # ModelClient.claim_score; set by the composition root): (key, id, score, deadline) -> taken here
    # (True), by another worker already (False), or no answer by the deadline (None: decided here
    # alone). None: no pool.
    claim: Callable[[str, str, float, float], Awaitable[bool | None]] | None = None

    def fold(self, selection_id: str, score: float) -> Issued:
        """Folds a score into the corrections: BadFeedback where its id is not ours, too old, or
        scored already (here, or by another worker that shared it)."""
        issued = self.ids.read(selection_id)
        self.take(issued, score)
        return issued

    def take(self, issued: Issued, score: float) -> None:
        """Folds the score of a read id in: BadFeedback where the id was scored meanwhile."""
        self.ids.mark(issued)
        self.book.add(issued.route, issued.model, issued.predicted, score)

    def authorized(self, authorization: str) -> bool:
        scheme, _, given = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token)


class Selector:
    """Orders a route's capable models for one request: the chosen model first, then the others as
    the strategy ranks them (the failover chain follows that order). Models the quality model does
    not know keep their ranked place after those it does."""

    def __init__(self, quality: QualityModel, strategy: Strategy, prices: dict[str, float], floor: float,
                 budget: float | None, lam: float, feedback: Feedback | None = None,
                 route_floors: dict[str, float] | None = None):
        """`route_floors`: a route's own quality floor, where it is not `floor`."""
        self.quality = quality
        self.feedback = feedback
        self._floors = dict(route_floors or {})
        self.strategy, self.floor, self.budget, self.lam = strategy, floor, budget, lam
        self._index = {m: i for i, m in enumerate(quality.models)}
        missing = [m for m in quality.models if m not in prices]
        if missing:
            raise ConfigError(f"selection.prices: no price for {missing}, which the quality model chooses between")
        self._prices = np.asarray([float(prices[m]) for m in quality.models])
        self._cheapest = float(self._prices.min())
        self._parts: dict[tuple[str, ...], tuple] = {}  # by the candidates: the encoder's predictor's part
        self._static_parts: dict[tuple[str, ...], tuple] = {}  # the static tier's

    def order(self, models: tuple[str, ...], vector: np.ndarray, route: str = "", static: bool = False
              ) -> Selected | None:
        """None where fewer than two of `models` are known (nothing to choose between), or `vector` is
        not of the quality model's encoder (serving refuses such a file at load; never a failed request).
        `route`: the decided route: its floor (`route_floors`), and the feedback that corrects the predictions.
        `static`: `vector` is the static tier's (None where the quality model has no predictor for it)."""
        parts = self._static_parts if static else self._parts
        part = parts.get(models)
        if part is None:
            model = self.quality.static if static else self.quality
            if model is None:
                return None
            part = parts[models] = self._part(models, model)
        known, unknown, weights, bias, margins, prices = part
        if len(known) < 2 or vector.shape[-1] != weights.shape[1]:
            return None
        raw = predicted = weights @ vector + bias
        feedback = self.feedback
        corrections = feedback.book.corrections(route, known) if feedback is not None else None
        if corrections is not None:
            predicted = predicted + np.asarray(corrections, dtype=predicted.dtype)
        rank = self._rank(predicted, margins, prices, self._floors.get(route, self.floor))
        explored = False
        if feedback is not None and feedback.explore > 0 and feedback.draw() < feedback.explore:
            explored = True  # another capable model first, drawn evenly; the rest keep their order
            rank.insert(0, rank.pop(1 + int(feedback.draw() * (len(rank) - 1)) % (len(rank) - 1)))
        first = rank[0]
        # The id carries the quality model's own predictions (for each model: Envoy may fail over to
        # the next): a score's residual is measured against them, so the correction converges on the
        # model's whole error (not on what is left of it).
        selection_id = feedback.ids.issue(route, known, raw, first) if feedback is not None else None
        return Selected(tuple(known[i] for i in rank) + unknown, float(predicted[first]), float(prices[first]),
                        explored, selection_id)

    def _part(self, models: tuple[str, ...], quality: QualityModel) -> tuple:
        """What order() reads for one tuple of candidates (a route's capable models: a config's few)."""
        known = tuple(m for m in models if m in self._index)
        idx = np.asarray([self._index[m] for m in known], dtype=np.int64)
        w = quality.weights[idx]
        return (known, tuple(m for m in models if m not in self._index), np.ascontiguousarray(w[:, :-1]), w[:, -1],
                quality.margins[idx], self._prices[idx])

    def _rank(self, predicted: np.ndarray, margins: np.ndarray, prices: np.ndarray, floor: float) -> list[int]:
        return rank(self.strategy, predicted, margins, prices, floor, self.budget, self.lam, self._cheapest)


def rank(strategy: Strategy, predicted: np.ndarray, margins: np.ndarray, prices: np.ndarray, floor: float = 0.8,
         budget: float | None = None, lam: float = 0.0, cheapest: float | None = None) -> list[int]:
    """The order `strategy` puts models in (indices into `predicted`, `margins`, `prices`), the
    chosen first: what serves (Selector), and what the bench judges. `cheapest`: the price `utility`
    weighs against (the quality model's cheapest; default: these prices' own)."""
    # A route's few models: Python's sort on floats beats numpy's per-call cost here.
    score, price = predicted.tolist(), prices.tolist()
    n = range(len(score))
    if strategy == "cheapest_meeting_floor":
        bound = (predicted - margins).tolist()
        # those predicted to meet the floor, cheapest first; then the rest, surest first
        return sorted(n, key=lambda i: (bound[i] < floor, price[i] if bound[i] >= floor else -bound[i]))
    if strategy == "best_within_budget":
        limit = budget if budget is not None else float("inf")
        if all(p > limit for p in price):  # none within it: the cheapest
            return sorted(n, key=lambda i: (price[i], -score[i]))
        return sorted(n, key=lambda i: (price[i] > limit, -score[i]))
    # relative to one reference price, whatever the route: one lam means one trade-off
    reference = cheapest if cheapest is not None else min(price)
    return sorted(n, key=lambda i: -(score[i] - lam * price[i] / reference))


def selector_for(config, previous: Feedback | None = None, learns: bool = False) -> Selector | None:
    """The selector a config's `selection` section asks for (a SelectionConfig); None: off. `learns`:
    serving, where feedback (if on) corrects, explores and signs ids; offline decisions do none of it
    (the same records replay to the same decisions). `previous`: the feedback of the selector a
    reload replaces, kept where it still applies (feedback_for)."""
    if config.path is None:
        return None
    return Selector(load_quality(config.path), config.strategy, config.prices, config.quality_floor, config.budget,
                    config.lam, feedback_for(config, previous) if learns else None, config.route_floors)


def feedback_for(config, previous: Feedback | None = None) -> Feedback | None:
    """Feedback as a SelectionConfig's `feedback` asks for; ConfigError, naming the key, without its
    token. From `previous` (a reload's) it keeps the ids it issued and scored, under the same token,
    and the corrections, for the same quality model and the same half-life and prior."""
    settings = config.feedback
    if not settings.enabled:
        return None
    token = os.environ.get(settings.token_env, "").strip().encode()
    if len(token) < 16:
        raise ConfigError(f"selection.feedback.token_env: set {settings.token_env} to a secret of at least 16 "
                          "characters (evaluators send it; it signs selection ids)")
    source = (config.path, settings.half_life, settings.prior)
    ids = SelectionIds(token, settings.max_age_s)
    if previous is not None and hmac.compare_digest(previous.token, token) \
            and previous.ids.max_age_s == settings.max_age_s:
        ids = previous.ids
    book = previous.book if previous is not None and previous.source == source else \
        FeedbackBook(settings.half_life, settings.prior)
    return Feedback(book, ids, settings.explore, settings.path, token, source=source)
