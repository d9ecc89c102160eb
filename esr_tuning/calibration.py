"""Fits router.calibration's maps on held-out decisions, and measures calibration (ECE, AUROC)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from router.calibration import KINDS, CalibrationConfig, features, kind_of
from router.classifier import RouteClassifier
from router.conversation import deciding_turn

_MIN_EXAMPLES = 20  # fewer examples of a kind (or only right or only wrong ones): a constant, their share


@dataclass(frozen=True)
class Examples:
    """Held-out decisions: their kinds (matched, context, default), features, and whether each was right."""

    kinds: list[str]
    x: np.ndarray
    right: np.ndarray
    in_scope: np.ndarray  # bool: the example's true route is not the default route

    def weights(self, default_share: float | None) -> np.ndarray:
        return share_weights(self.in_scope, default_share)


def share_weights(in_scope: np.ndarray, default_share: float | None) -> np.ndarray:
    """Per example, so that the default route's examples (~in_scope) weigh `default_share` of the
    whole (None, or no examples on one side: the data's own mix, every weight 1)."""
    n, n_out = len(in_scope), int((~in_scope).sum())
    if default_share is None or n_out == 0 or n_out == n:
        return np.ones(n)
    return np.where(in_scope, (1 - default_share) * n / (n - n_out), default_share * n / n_out)


def fit_logistic(x: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None, l2: float = 1e-3,
                 steps: int = 50) -> tuple[float, ...]:
    """Weighted logistic regression by Newton's method on standardised features, returned on the raw ones."""
    weight = np.ones(len(y)) if weight is None else weight
    if len(y) < _MIN_EXAMPLES or y.all() or not y.any():
        return (round(float((weight @ y + 1) / (weight.sum() + 2)), 6),)  # Laplace-smoothed share
    mean, std = x.mean(axis=0), x.std(axis=0)
    std = np.where(std > 1e-9, std, 1.0)
    z = np.hstack([np.ones((len(x), 1)), (x - mean) / std])
    w = np.zeros(z.shape[1])
    reg = l2 * np.eye(z.shape[1])
    reg[0, 0] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -50, 50)))
        grad = z.T @ (weight * (p - y)) + reg @ w
        hess = (z * (weight * p * (1 - p))[:, None]).T @ z + reg + 1e-9 * np.eye(z.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    raw = w[1:] / std
    return (float(w[0] - np.dot(raw, mean)), *map(float, raw))


def calibrate(examples: Examples, default_share: float | None = None) -> CalibrationConfig:
    """One map per kind of decision, fitted on held-out decisions; `default_share`: the share of
    default-route traffic to calibrate for (see Examples.weights; None: the examples' own)."""
    kinds = np.asarray(examples.kinds)
    weight = examples.weights(default_share)
    maps = {}
    for kind in KINDS:
        mask = kinds == kind
        if mask.any():
            # Rounded here, so that what fit reports is what the written config serves.
            maps[kind] = tuple(round(v, 6) for v in fit_logistic(examples.x[mask], examples.right[mask].astype(np.float64),
                                                                 weight[mask]))
    prior = float(weight[~examples.in_scope].sum() / weight.sum())
    return CalibrationConfig(**maps, fallback=round(prior, 6), examples=int(len(kinds)))


def reliability(confidence: Sequence[float] | np.ndarray, right: Sequence[bool] | np.ndarray, bins: int = 15,
                weight: np.ndarray | None = None) -> dict:
    """Expected calibration error (equal-width bins, weighted by their share of the examples, or of
    `weight`), AUROC of the confidence for right vs wrong decisions, and the bins themselves (the
    reliability diagram)."""
    c = np.asarray(confidence, dtype=np.float64)
    y = np.asarray(right, dtype=bool)
    w = np.ones(len(c)) if weight is None else np.asarray(weight, dtype=np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(c, edges[1:-1]), 0, bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        mask = which == b
        if mask.any():
            conf, acc = np.average(c[mask], weights=w[mask]), np.average(y[mask], weights=w[mask])
            ece += abs(conf - acc) * w[mask].sum() / w.sum()
            table.append({"low": round(float(edges[b]), 4), "high": round(float(edges[b + 1]), 4), "count": int(mask.sum()),
                          "confidence": round(float(conf), 4), "accuracy": round(float(acc), 4)})
    return {"ece": round(float(ece), 4), "auroc": _auroc(c, y),
            "mean_confidence": round(float(c.mean()), 4) if len(c) else None, "bins": table}


def _auroc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """The probability that a right decision scores above a wrong one (ties count half)."""
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]  # 1-based, ties averaged
    return round(float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)), 4)


def labelled_examples(classifier: RouteClassifier, scores: np.ndarray, truth: np.ndarray) -> Examples:
    """Each row's decision as the router makes it (kind, features) and whether it was right
    (`truth`: route index per row, -1 the default route)."""
    choice = classifier.choose(scores)
    n, has_default = len(classifier.routes), classifier.has_default_class
    kinds = [kind_of(int(c), own_turn=True) for c in choice]
    x = np.stack([features(row, int(c), n, has_default) for row, c in zip(scores, choice)])
    return Examples(kinds, x, choice == truth, truth >= 0)


def conversation_examples(classifier: RouteClassifier, turn_scores: Sequence[Sequence[np.ndarray]],
                          labels: Sequence[str], gate: float | None) -> Examples:
    """The same for every user turn (`turn_scores`: per dialogue, per turn, the scores of the texts its
    request is routed on; `labels` flattened alike), decided as RouteClassifier.conversation_decision does."""
    names = [r.name for r in classifier.routes]
    n, has_default = len(names), classifier.has_default_class
    default = classifier.config.default_route.name
    kinds, x, right = [], [], []
    for scores, label in zip((s for dialogue in turn_scores for s in dialogue), labels):
        turn, choice = deciding_turn(classifier, scores, gate)
        kinds.append(kind_of(choice, turn == len(scores) - 1))
        x.append(features(scores[turn], choice, n, has_default))
        right.append((names[choice] if choice >= 0 else default) == label)
    return Examples(kinds, np.stack(x), np.asarray(right), np.asarray([label != default for label in labels]))
