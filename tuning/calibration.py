"""Fits router.calibration's maps on held-out decisions, and measures calibration (ECE, AUROC)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from router.calibration import KINDS, CalibrationConfig

_MIN_EXAMPLES = 20  # fewer examples of a kind (or only right or only wrong ones): a constant, their share


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 50) -> tuple[float, ...]:
    """Logistic regression by Newton's method on standardised features, returned on the raw ones."""
    if len(y) < _MIN_EXAMPLES or y.all() or not y.any():
        return (round(float((y.sum() + 1) / (len(y) + 2)), 6),)  # Laplace-smoothed share
    mean, std = x.mean(axis=0), x.std(axis=0)
    std = np.where(std > 1e-9, std, 1.0)
    z = np.hstack([np.ones((len(x), 1)), (x - mean) / std])
    w = np.zeros(z.shape[1])
    reg = l2 * np.eye(z.shape[1])
    reg[0, 0] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -50, 50)))
        grad = z.T @ (p - y) + reg @ w
        hess = (z * (p * (1 - p))[:, None]).T @ z + reg + 1e-9 * np.eye(z.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    raw = w[1:] / std
    return (float(w[0] - np.dot(raw, mean)), *map(float, raw))


def fit_calibration(kinds: Sequence[str], x: np.ndarray, right: np.ndarray, default_share: float) -> CalibrationConfig:
    """One map per kind of decision from held-out decisions: their kinds, features and whether each was right."""
    kinds_arr = np.asarray(kinds)
    maps = {}
    for kind in KINDS:
        mask = kinds_arr == kind
        if mask.any():
            maps[kind] = fit_logistic(x[mask], right[mask].astype(np.float64))
    return CalibrationConfig(**maps, fallback=round(float(default_share), 6), examples=int(len(kinds_arr)))


def reliability(confidence: Sequence[float], right: Sequence[bool], bins: int = 15) -> dict:
    """Expected calibration error (equal-width bins, weighted by their share), AUROC of the
    confidence for right vs wrong decisions, and the bins themselves (for the reliability diagram)."""
    c = np.asarray(confidence, dtype=np.float64)
    y = np.asarray(right, dtype=bool)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(c, edges[1:-1]), 0, bins - 1)
    table, ece = [], 0.0
    for b in range(bins):
        mask = which == b
        if mask.any():
            gap = abs(float(c[mask].mean()) - float(y[mask].mean()))
            ece += gap * mask.mean()
            table.append({"low": round(float(edges[b]), 4), "high": round(float(edges[b + 1]), 4), "count": int(mask.sum()),
                          "confidence": round(float(c[mask].mean()), 4), "accuracy": round(float(y[mask].mean()), 4)})
    return {"ece": round(float(ece), 4), "auroc": _auroc(c, y), "mean_confidence": round(float(c.mean()), 4)
            if len(c) else None, "bins": table}


def _auroc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """The probability that a right decision scores above a wrong one (ties count half)."""
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]  # 1-based, ties averaged
    return round(float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)), 4)
