"""An encoder that embeds each text once: offline commands read the same texts again (a config's
utterances for its classifier, then fold by fold; a conversation's turns, request by request)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


class EachTextOnce:
    """`encoder`, with every vector it gave kept for the texts it is asked again; the rest of its
    attributes as they are."""

    def __init__(self, encoder):
        self._encoder = encoder
        self._known: dict[str, np.ndarray] = {}

    def __getattr__(self, name: str):
        return getattr(self._encoder, name)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return self._encoder.encode(texts)
        missing = list(dict.fromkeys(t for t in texts if t not in self._known))
        if missing:
            self._known.update(zip(missing, self._encoder.encode(missing)))
        return np.stack([self._known[t] for t in texts])
