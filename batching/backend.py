"""The contract between the batcher and whatever model it feeds."""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class Backend(Protocol):
    """A model the batcher drives. Only the batcher's model thread calls `embed`."""

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, already truncated to what the model accepts."""
        ...

    def embed(self, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """One float32 row per input, in input order. Pads internally."""
        ...

    def prepare_thread(self) -> None:
        """Called once on the model thread before its first batch: per-thread runtime settings
        (torch's intra-op thread count is per thread, for one) belong here."""
        ...

    def warmup(self) -> None:
        """Run representative shapes once so the first real batch is not slow."""
        ...


class Embedder(Protocol):
    """What callers embed through: the batcher in this process, or a client of the batcher in a
    model process (modelsock.client). Both raise BatcherError subclasses, never wait past `deadline`."""

    async def embed(self, text: str, deadline: float) -> np.ndarray:
        """The embedding of `text`; `deadline` is time.monotonic() seconds."""
        ...

    async def started(self) -> None:
        """Returns once embeddings can be asked for."""
        ...

    async def aclose(self, drain_timeout: float = 10.0) -> None:
        ...
