"""Turns a decision's scores into the probability that its route is right (x-semantic-route-confidence).

A score's scale depends on the scorer (a cosine, a probability, an energy), so no policy can be set
on it. `fit` learns, on examples the scorer was not fitted on, a logistic map from three features of
the score row to "the chosen route was right", one per kind of decision: `matched` (the request's
own turn chose), `context` (an earlier turn chose) and `default` (nothing cleared a threshold, or the
default route's own examples won), since what makes each right differs. The features rank decisions
(a margin of 0.3 is surer than one of 0.01), so the confidence is useful for policy, not only
calibrated on average.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
import numpy as np

from esr_settings import SettingError

KINDS = ("matched", "context", "default")
FEATURES = 3  # the chosen (or best) route's score, its margin over the runner-up, the default class's score


@dataclass(frozen=True)
class CalibrationConfig:
    """`semantic-router fit` writes it; each kind is [bias, w_score, w_margin, w_default] of a logistic
    map, or one number (a constant probability, when fit had too few examples of that kind)."""

    matched: tuple[float, ...] = ()
    context: tuple[float, ...] = ()
    default: tuple[float, ...] = ()
    # The probability that the default route is right when no score was looked at (a fallback):
    # the share of the calibration examples that belong to the default route.
    fallback: float = 0.0
    examples: int = 0  # how many it was fitted on (for whoever reads the config)

    def __post_init__(self):
        for kind in KINDS:
            value = getattr(self, kind)
            if len(value) not in (0, 1, FEATURES + 1) or not all(math.isfinite(v) for v in value):
                raise SettingError(kind, f"must be one probability or {FEATURES + 1} finite coefficients")
            if len(value) == 1 and not 0.0 <= value[0] <= 1.0:
                raise SettingError(kind, "a constant must be a probability between 0 and 1")
        if not 0.0 <= self.fallback <= 1.0:
            raise SettingError("fallback", "must be between 0 and 1")



def kind_of(choice: int, own_turn: bool) -> str:
    """A decision's kind: the default route (choice -1), or a route the request's own turn chose
    (matched) or an earlier turn of its conversation did (context)."""
    return "default" if choice < 0 else "matched" if own_turn else "context"


def features(row: np.ndarray, choice: int, n_routes: int, has_default_class: bool) -> np.ndarray:
    """The features of one score row and its choice (a route index, -1 the default route).

    In Python floats over the row's values (float32, so exact as float64): every decision on the
    event loop computes these, and numpy's calls over ten values cost more than the arithmetic."""
    values = row.tolist()
    best = second = -math.inf
    seen = 0
    for value in values[:n_routes]:
        if not math.isfinite(value):  # -inf: a route only keywords and rules reach
            continue
        seen += 1
        if value > best:
            best, second = value, best
        elif value > second:
            second = value
    if not seen:
        raise ValueError("no route has a finite score to take features of")
    if seen == 1:
        second = best
    own = values[choice] if choice >= 0 else best
    # The runner-up of the best route is the second; of any other choice, the best. A choice tied
    # with the best has the best as its runner-up either way (their difference is 0).
    runner_up = second if choice < 0 or own == best else best
    default = values[-1] if has_default_class else 0.0
    return np.asarray([own, own - runner_up, default], dtype=np.float64)


class Calibrator:
    """Confidence of a decision from its kind and features; uncalibrated configs (no `calibration`
    section) get a squashed margin over the threshold instead, which ranks but is not a probability."""

    def __init__(self, config: CalibrationConfig | None):
        self.config = config
        # Each kind's coefficients, resolved once (a kind fit left empty takes matched's): a
        # confidence per decision on the event loop, and the weights as the array np.dot makes of them.
        self._models: dict[str, tuple[float, np.ndarray | None]] = {}
        if config is not None:
            for kind in KINDS:
                coef = getattr(config, kind) or config.matched or (0.5,)
                self._models[kind] = (float(coef[0]), None) if len(coef) == 1 else \
                    (coef[0], np.asarray(coef[1:], dtype=np.float64))

    def fallback(self) -> float:
        return self.config.fallback if self.config is not None else 0.0

    def confidence(self, kind: str, x: np.ndarray, threshold: float) -> float:
        if self.config is None:
            # Uncalibrated: above the threshold by the margin, squashed; the default route at 0.5.
            z = 10.0 * min(x[0] - threshold, x[1]) if kind != "default" else 0.0
            return _sigmoid(z)
        bias, weights = self._models[kind]
        if weights is None:
            return bias
        return _sigmoid(bias + float(np.dot(weights, x)))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))
