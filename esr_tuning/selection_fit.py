"""Fits model selection (router/selection.py) on a team's eval rows: a predictor of each model's score
from the embedding the router computes, and each model's margin, calibrated on held-out rows so that
the share of requests whose chosen model scores under the floor stays near the stated rate.

Two predictors, compared by `python -m bench.quality.selection_bench`: ridge regression on the embedding
(what serves: one small matrix product a request) and the mean score of the k most similar training
prompts (kNN: as good where data is plentiful, but it keeps every training vector).
"""

from __future__ import annotations

import numpy as np

from router.selection import QualityModel


def ridge(vectors: np.ndarray, scores: np.ndarray, l2: float = 1.0) -> np.ndarray:
    """(models, dimension + 1) weights predicting `scores` (n, models) from `vectors` (n, dimension)."""
    x = np.hstack([vectors, np.ones((len(vectors), 1))])
    penalty = l2 * np.eye(x.shape[1])
    penalty[-1, -1] = 0.0  # the bias is not shrunk
    return np.linalg.solve(x.T @ x + penalty, x.T @ scores).T


class Knn:
    """Each model's mean score over the `k` most similar training prompts (cosine)."""

    def __init__(self, vectors: np.ndarray, scores: np.ndarray, k: int = 25):
        self.vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        self.scores, self.k = scores, k

    def predict(self, vectors: np.ndarray) -> np.ndarray:
        out = np.empty((len(vectors), self.scores.shape[1]))
        for start in range(0, len(vectors), 1024):
            sims = vectors[start:start + 1024] @ self.vectors.T
            near = np.argpartition(-sims, self.k, axis=1)[:, : self.k]
            out[start:start + 1024] = self.scores[near].mean(axis=1)
        return out


def margins(predicted: np.ndarray, scores: np.ndarray, alpha: float) -> np.ndarray:
    """Per model, split-conformal: the (1 - alpha) quantile of how far predictions overstate the true
    score on held-out rows (finite-sample corrected), so that a new prompt's score is at least its
    prediction less the margin with probability about 1 - alpha."""
    over = predicted - scores
    n = len(over)
    level = min(1.0, np.ceil((n + 1) * (1 - alpha)) / n)
    return np.quantile(over, level, axis=0, method="higher")


def fit_quality(models: list[str], vectors: np.ndarray, scores: np.ndarray, alpha: float = 0.1,
                calibration: float = 0.25, l2: float = 1.0, seed: int = 0) -> QualityModel:
    """Ridge on a share of the rows, margins on the rest (`calibration`), then ridge again on all:
    the margins are those of a predictor fitted on less, so a little wide, never narrow. A NaN in
    `scores` is a prompt that model was not scored on: each model learns from the rows it was."""
    order = np.random.default_rng(seed).permutation(len(vectors))
    weights, fitted = [], []
    for m in range(len(models)):  # a model at a time, on its rows, in one order (scored on all: one split)
        seen = ~np.isnan(scores[:, m])
        own = order[seen[order]]
        cut_m = min(int(len(own) * (1 - calibration)), len(own) - 1)
        if cut_m < 1:
            raise ValueError(f"{models[m]}: scored on {len(own)} prompts; a fit and its margin need more")
        fit_m, cal_m = own[:cut_m], own[cut_m:]
        first = ridge(vectors[fit_m], scores[fit_m, m:m + 1], l2)
        x_cal = np.hstack([vectors[cal_m], np.ones((len(cal_m), 1))])
        fitted.append(margins(x_cal @ first.T, scores[cal_m, m:m + 1], alpha)[0])
        weights.append(ridge(vectors[seen], scores[seen, m:m + 1], l2)[0])
    return QualityModel(tuple(models), np.stack(weights), np.asarray(fitted), alpha)
