"""Semantic matching: a request whose last user turn means what an earlier one's did may take its
answer, within the same scope only (tenant, routed model, parameters and the conversation before that
turn: keys.scope_key) and only on the routes a team turned it on for (`cache.semantic_routes`:
where an answer cannot depend on what the prompt names, "what is your name" but not "weather in
Paris"). Nearest earlier turn by cosine, at `cache.semantic_threshold` or above."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class SemanticIndex:
    """The last-turn embeddings of kept answers, per scope; bounded per scope and in scopes."""

    def __init__(self, per_scope: int = 256, scopes: int = 4096):
        self.per_scope = per_scope
        self.scopes = scopes
        self._index: OrderedDict[str, tuple[list[np.ndarray], list[str]]] = OrderedDict()

    def add(self, scope: str, vector: np.ndarray, key: str) -> None:
        vectors, keys = self._index.setdefault(scope, ([], []))
        self._index.move_to_end(scope)
        if key in keys:
            return
        vectors.append(np.asarray(vector, dtype=np.float32))
        keys.append(key)
        if len(keys) > self.per_scope:
            del vectors[0], keys[0]
        while len(self._index) > self.scopes:
            self._index.popitem(last=False)

    def nearest(self, scope: str, vector: np.ndarray, threshold: float) -> tuple[str, float] | None:
        """The key of the closest earlier turn in `scope` at `threshold` or above, and its cosine."""
        found = self._index.get(scope)
        if not found:
            return None
        vectors, keys = found
        scores = np.stack(vectors) @ np.asarray(vector, dtype=np.float32)
        best = int(np.argmax(scores))
        return (keys[best], float(scores[best])) if scores[best] >= threshold else None
