"""Semantic matching: a request whose last user turn means what an earlier one's did may take its
answer, within the same scope only (tenant, routed model, parameters and the conversation before that
turn: keys.scope_key) and only on the routes a team turned it on for (`cache.semantic_routes`:
where an answer cannot depend on what the prompt names, "what is your name" but not "weather in
Paris"). Nearest earlier turn by cosine, at `cache.semantic_threshold` or above.

The index holds one encoder's vectors (`encoder`: cleared when it changes), is bounded in bytes
(least recently used scope's oldest entry out first), and drops an entry whose answer is gone."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

# What an entry costs beside its vector: its key, the lists' slots, the scope's share.
ENTRY_OVERHEAD = 160


class SemanticIndex:
    """The last-turn embeddings of kept answers, per scope; bounded in bytes, per scope and in scopes."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, per_scope: int = 256, scopes: int = 4096):
        self.max_bytes = max_bytes
        self.per_scope = per_scope
        self.scopes = scopes
        self.bytes = 0
        self.encoder: str | None = None  # whose vectors these are
        self._index: OrderedDict[str, tuple[list[np.ndarray], list[str]]] = OrderedDict()
        self._scope_of: dict[str, str] = {}  # key -> its scope

    def __len__(self) -> int:
        return len(self._scope_of)

    def use_encoder(self, encoder: str) -> bool:
        """Holds `encoder`'s vectors from now on; True when that cleared another's."""
        changed = self.encoder is not None and self.encoder != encoder
        if changed:
            self.clear()
        self.encoder = encoder
        return changed

    def clear(self) -> None:
        self._index.clear()
        self._scope_of.clear()
        self.bytes = 0

    def add(self, scope: str, vector: np.ndarray, key: str) -> None:
        if key in self._scope_of:
            return
        vector = np.asarray(vector, dtype=np.float32)
        vectors, keys = self._index.setdefault(scope, ([], []))
        self._index.move_to_end(scope)
        if vectors and vectors[0].shape != vector.shape:
            return  # another encoder's vector (a record from before a change): never comparable
        vectors.append(vector)
        keys.append(key)
        self._scope_of[key] = scope
        self.bytes += _cost(vector, key)
        if len(keys) > self.per_scope:
            self._drop_oldest(scope)
        while len(self._index) > self.scopes:
            oldest = next(iter(self._index))
            while self._index.get(oldest):
                self._drop_oldest(oldest)
        while self.bytes > self.max_bytes and self._index:
            self._drop_oldest(next(iter(self._index)))

    def remove(self, key: str) -> None:
        """Drops `key`'s entry (its answer is gone)."""
        scope = self._scope_of.pop(key, None)
        if scope is None:
            return
        vectors, keys = self._index[scope]
        i = keys.index(key)
        self.bytes -= _cost(vectors[i], key)
        del vectors[i], keys[i]
        if not keys:
            del self._index[scope]

    def _drop_oldest(self, scope: str) -> None:
        vectors, keys = self._index[scope]
        self.remove(keys[0])

    def nearest(self, scope: str, vector: np.ndarray, threshold: float) -> tuple[str, float] | None:
        """The key of the closest earlier turn in `scope` at `threshold` or above, and its cosine."""
        found = self._index.get(scope)
        if not found or found[0][0].shape != np.shape(vector):
            return None
        vectors, keys = found
        scores = np.stack(vectors) @ np.asarray(vector, dtype=np.float32)
        best = int(np.argmax(scores))
        return (keys[best], float(scores[best])) if scores[best] >= threshold else None


def _cost(vector: np.ndarray, key: str) -> int:
    return vector.nbytes + len(key) + ENTRY_OVERHEAD
