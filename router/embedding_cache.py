"""Embeddings of recent texts, keyed by a hash of the text: each request of a conversation re-sends
every earlier turn, and each distinct text should reach the model once."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from typing import Awaitable, Callable

import numpy as np

from batching import DeadlineExceeded
from router import metrics


def _key(text: str) -> bytes:
    # A digest, not the text: an entry costs the same for a 40 KiB prompt as for "yes".
    # surrogatepass: JSON may carry a lone surrogate (\ud800), which strict UTF-8 cannot encode.
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


async def _frozen(compute: Callable[[], Awaitable[np.ndarray]]) -> np.ndarray:
    vector = np.array(await compute(), dtype=np.float32)  # a copy: a batch row would pin its whole batch
    vector.setflags(write=False)  # shared by every request with this text
    return vector


class _Flight:
    """One embedding being computed, and how many requests wait for it."""

    __slots__ = ("task", "waiters", "own")

    def __init__(self, task: asyncio.Future, own: Callable[[], Awaitable[np.ndarray]]):
        self.task = task
        self.waiters = 0
        self.own = own  # the compute of the request that started it (its deadline)


class EmbeddingCache:
    """LRU of `size` embeddings; a text asked for while its embedding is being computed waits for
    that one (result `shared`) instead of queueing a second. Event-loop only; failures are not kept."""

    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._flights: dict[bytes, _Flight] = {}

    async def get(self, text: str, compute: Callable[[], Awaitable[np.ndarray]], retried: bool = False) -> np.ndarray:
        if self.size <= 0:
            return await compute()
        key = _key(text)
        hit = self._data.get(key)
        if hit is not None:
            self._data.move_to_end(key)
            metrics.EMBEDDING_CACHE.labels("hit").inc()
            return hit
        flight = self._flights.get(key)
        if flight is None:
            metrics.EMBEDDING_CACHE.labels("miss").inc()
            flight = self._flights[key] = _Flight(asyncio.ensure_future(_frozen(compute)), compute)
            flight.task.add_done_callback(lambda task: self._landed(key, task))
        else:
            metrics.EMBEDDING_CACHE.labels("shared").inc()
        shared = flight.own is not compute
        flight.waiters += 1
        try:
            # shield: one waiter leaving (its client went away) must not cancel the others' result.
            return await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            if flight.waiters == 1:  # the last one: nobody wants it, so the batcher may drop it
                flight.task.cancel()
            raise
        except DeadlineExceeded:
            if not shared or retried:
                raise
            # The flight ran to the deadline of the request that started it; this one may have
            # time left, which it spends on its own try (failing at once if it has none).
            return await self.get(text, compute, retried=True)
        finally:
            flight.waiters -= 1

    def peek(self, text: str) -> np.ndarray | None:
        """The cached embedding of `text`, without a coroutine: for callers with many texts, most
        of them cached (the prompt guard's pieces of a long conversation)."""
        hit = self._data.get(_key(text)) if self.size > 0 else None
        if hit is not None:
            self._data.move_to_end(_key(text))
            metrics.EMBEDDING_CACHE.labels("hit").inc()
        return hit

    def resize(self, size: int) -> None:
        self.size = size
        self._trim()

    def _landed(self, key: bytes, task: asyncio.Future) -> None:
        self._flights.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            return
        self._data[key] = task.result()
        self._trim()

    def _trim(self) -> None:
        while len(self._data) > max(self.size, 0):
            self._data.popitem(last=False)
        metrics.EMBEDDING_CACHE_ENTRIES.set(len(self._data))

    def __len__(self) -> int:
        return len(self._data)
