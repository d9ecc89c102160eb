"""The event loop decides one request at a time, on one row of scores, in Python floats
(RouteClassifier.choose_one, static_tier.lead, calibration.features); eval and fit read whole
score matrices with numpy (choose, margins). Offline must equal online: the same answers, bit for
bit, on the shapes that make them hard (ties, routes only rules reach, a NaN)."""

from __future__ import annotations

import numpy as np
import pytest

from router.calibration import features
from router.classifier import RouteClassifier
from router.static_tier import lead, margins
from tests.support.fakes import config, encode

ROUTES = [{"name": "math", "model": "math-model", "utterances": ["m1", "m2"]},
          {"name": "code", "model": "code-model", "utterances": ["c1", "c2"]},
          {"name": "chat", "model": "chat-model", "utterances": ["m3"]}]


def classifiers() -> list[RouteClassifier]:
    with_default = config(routes=ROUTES, default_route={"name": "general", "model": "general-model",
                                                        "utterances": ["g1"]})
    thresholds = config(routes=[{**ROUTES[0], "threshold": 0.5}, ROUTES[1], {**ROUTES[2], "threshold": -1.0}])
    return [RouteClassifier(with_default, encode), RouteClassifier(thresholds, encode)]


def hard_rows(columns: int, dtype) -> np.ndarray:
    """Random rows on a coarse grid (so ties are common), with -inf, inf and NaN sprinkled in."""
    rng = np.random.default_rng(7)
    rows = rng.choice(np.asarray([-0.5, 0.0, 0.3, 0.5, 0.79, 0.8, 0.8000001, 0.95, 1.0], dtype=dtype),
                      size=(4000, columns))
    odd = rng.random(rows.shape)
    rows[odd < 0.05] = -np.inf
    rows[(odd >= 0.05) & (odd < 0.07)] = np.nan
    rows[(odd >= 0.07) & (odd < 0.08)] = np.inf
    rows[:400] = rng.normal(size=(400, columns)).astype(dtype)  # and plain scores, unequal
    return rows


def features_by_sorting(row: np.ndarray, choice: int, n_routes: int, has_default_class: bool) -> np.ndarray:
    """features as numpy computed it before the loop's reading (the specification)."""
    routes = row[:n_routes]
    scored = np.flatnonzero(np.isfinite(routes))
    order = scored[np.argsort(routes[scored])[::-1]]
    best = float(routes[order[0]])
    second = float(routes[order[1]]) if len(order) > 1 else best
    own = float(routes[choice]) if choice >= 0 else best
    runner_up = second if choice < 0 or choice == order[0] else best
    default = float(row[-1]) if has_default_class else 0.0
    return np.asarray([own, own - runner_up, default], dtype=np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_loops_one_row_readings_equal_the_vectorised_ones(dtype):
    for classifier in classifiers():
        n = len(classifier.routes)
        rows = hard_rows(n + int(classifier.has_default_class), dtype)
        choices = classifier.choose(rows)
        assert (choices >= 0).any() and (choices < 0).any()
        for row, choice in zip(rows, choices):
            assert classifier.choose_one(row) == choice
            if choice >= 0:
                vectorised = margins(classifier, row[None, :], np.asarray([choice]))[0]
                assert lead(classifier, row, int(choice)) == vectorised or (np.isnan(vectorised)
                                                                           and np.isnan(lead(classifier, row, int(choice))))
            if np.isfinite(row[:n]).any():
                got = features(row, int(choice), n, classifier.has_default_class)
                want = features_by_sorting(row, int(choice), n, classifier.has_default_class)
                assert np.array_equal(got, want, equal_nan=True)


def test_a_row_with_no_finite_route_score_has_no_features():
    with pytest.raises(ValueError):
        features(np.asarray([-np.inf, np.nan, 0.5]), -1, 2, True)
