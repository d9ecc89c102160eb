"""Answers kept in Redis, so that the routers of a deployment share them, and the semantic index's
entries passed between routers through a Redis stream (each router keeps its own index in process,
fed from the stream). Redis down or slow costs a request at most `timeout_s`, once: the store is
then left alone for a second (StoreUnavailable at once), and requests route and reach their
backends as without a cache."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import numpy as np
import redis.asyncio as redis

from esr_cache.semantic import SemanticIndex, Turn, vector_bytes, vector_from
from esr_cache.store import Entry, StoreUnavailable

log = logging.getLogger(__name__)

_PAUSE_S = 1.0  # after a failure, how long the store is not tried
_INDEX_STREAM = "index"
_INDEX_MAXLEN = 100_000


class RedisStore:
    def __init__(self, url: str, ttl_s: float, timeout_s: float, prefix: str = "esr:cache:"):
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.prefix = prefix
        self.url = url
        self._client = redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._down_until = 0.0

    async def get(self, key: str) -> Entry | None:
        raw = await self._call(self._client.get(self.prefix + key))
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            if not isinstance(data["answer"], dict):
                raise TypeError("answer is not an object")
            return Entry(data["answer"], int(data["size"]), float(data["upstream_s"]), float(data["stored_at"]))
        except (ValueError, KeyError, TypeError) as exc:  # not ours, or damaged: a miss
            log.warning("response cache entry unreadable", extra={"error": type(exc).__name__})
            return None

    async def put(self, key: str, entry: Entry) -> None:
        data = {"answer": entry.answer, "size": entry.size, "upstream_s": entry.upstream_s, "stored_at": entry.stored_at}
        await self._call(self._client.set(self.prefix + key, json.dumps(data), ex=max(1, int(self.ttl_s))))

    async def publish(self, turn: Turn, key: str, encoder: str) -> None:
        fields: dict[Any, Any] = {"scope": turn.scope, "key": key, "encoder": encoder, "length": turn.length,
                                  "vector": vector_bytes(turn.vector)}
        await self._call(self._client.xadd(self.prefix + _INDEX_STREAM, fields, maxlen=_INDEX_MAXLEN,
                                           approximate=True))

    async def follow(self, index: SemanticIndex) -> None:
        """Feeds `index` with every router's entries from the stream, from the oldest kept on; runs
        until cancelled, waiting out Redis when it is away."""
        # A connection of its own: it waits on the stream far longer than a lookup may.
        client = redis.from_url(self.url, socket_timeout=5.0, socket_connect_timeout=1.0)
        last = "0-0"
        try:
            while True:
                try:
                    reply: Any = await client.xread({self.prefix + _INDEX_STREAM: last}, count=1000, block=1000)
                except (redis.RedisError, OSError, asyncio.TimeoutError):
                    await asyncio.sleep(_PAUSE_S)
                    continue
                last = self._feed(index, reply, last)
        finally:
            await client.aclose()

    @staticmethod
    def _feed(index: SemanticIndex, reply: Any, last: str) -> str:
        """Adds each record of `reply` made with the index's encoder; a malformed record (another
        writer's, a damaged one) is skipped and logged, never the end of the follower."""
        for _stream, records in reply or []:
            for record_id, fields in records:
                last = record_id
                try:
                    if fields.get(b"encoder", b"").decode() != (index.encoder or ""):
                        continue  # another encoder's vector (a router before a model change)
                    vector = vector_from(fields[b"vector"])
                    if vector.size == 0 or not np.all(np.isfinite(vector)):
                        raise ValueError("empty or not finite")
                    index.add(fields[b"scope"].decode(), vector, fields[b"key"].decode(), int(fields.get(b"length", 0)))
                except (KeyError, ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
                    log.warning("semantic index record skipped", extra={"record": str(record_id)[:64],
                                                                       "error": type(exc).__name__})
        return last

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, command):
        if time.monotonic() < self._down_until:
            command.close()  # never awaited: the coroutine is dropped
            raise StoreUnavailable("paused after a failure")
        try:
            async with asyncio.timeout(self.timeout_s):
                return await command
        except (redis.RedisError, OSError, TimeoutError) as exc:
            if time.monotonic() >= self._down_until:
                log.warning("response cache store unavailable: skipped for %.0f s", _PAUSE_S,
                            extra={"error": type(exc).__name__})
            self._down_until = time.monotonic() + _PAUSE_S
            raise StoreUnavailable(type(exc).__name__) from None
