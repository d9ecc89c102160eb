"""Route scores as cosine similarity to each route's example utterances (top-k, max or mean)."""

from __future__ import annotations

from typing import Callable, Literal, Sequence

import numpy as np

Encode = Callable[[Sequence[str]], np.ndarray]


class SimilarityScorer:
    def __init__(self, groups: Sequence[Sequence[str]], encode: Encode, top_k: int = 1,
                 aggregation: Literal["max", "mean"] = "mean"):
        """`groups`: the example utterances of each scored class, in column order; an empty group
        (a route reached only by keywords or rules) scores -inf, so the model never chooses it."""
        texts = [u for g in groups for u in g]
        self._matrix = np.ascontiguousarray(encode(texts), dtype=np.float32)
        self._sizes = [len(g) for g in groups]
        self._starts = np.concatenate([[0], np.cumsum(self._sizes)[:-1]]).astype(np.int64)
        self._filled = np.asarray([size > 0 for size in self._sizes])
        self._top_k = top_k
        self._mean = aggregation == "mean" and top_k > 1

    def scores(self, embeddings: np.ndarray) -> np.ndarray:
        """(n, groups): each group's best (top_k 1) or top-k aggregated similarity."""
        sims = embeddings @ self._matrix.T
        if self._top_k == 1 and self._filled.all():
            return np.maximum.reduceat(sims, self._starts, axis=1)
        cols = []
        for start, size in zip(self._starts, self._sizes):
            if size == 0:
                cols.append(np.full(len(sims), -np.inf, dtype=sims.dtype))
                continue
            block = sims[:, start : start + size]
            k = min(self._top_k, size)
            top = -np.partition(-block, k - 1, axis=1)[:, :k]
            cols.append(top.mean(axis=1) if self._mean else top.max(axis=1))
        return np.stack(cols, axis=1)
