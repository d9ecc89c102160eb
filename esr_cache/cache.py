"""The cache as the ext_proc service uses it: look up a routed request, replay a hit in the shape
the request asks for, keep an answer once it has come back whole."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Mapping


from esr_cache import answers, metrics
from esr_cache.config import CacheConfig
from esr_cache.keys import tenant_of
from esr_cache.semantic import SemanticIndex, Turn
from esr_cache.store import Entry, MemoryStore, StoreUnavailable

if TYPE_CHECKING:
    from esr_cache.redis_store import RedisStore

log = logging.getLogger(__name__)

READ_INLINE = 64 * 1024  # an answer this long is read on the event loop (well under a millisecond)
OPT_OUT = "x-semantic-cache"  # a request with `x-semantic-cache: bypass` is neither answered nor kept


def opted_out(headers: Mapping[str, str]) -> bool:
    """`cache-control: no-store` (or no-cache) or the opt-out header: the request passes the cache by."""
    control = headers.get("cache-control", "").lower()
    return "no-store" in control or "no-cache" in control or headers.get(OPT_OUT, "").lower() == "bypass"


class ResponseCache:
    def __init__(self, config: CacheConfig):
        self.config = config
        self.index = SemanticIndex(config.semantic_index_bytes)
        self.memory = MemoryStore(config.max_bytes, config.ttl_s, on_drop=self.index.remove)
        self.shared: RedisStore | None = None  # backend redis: kept there instead
        if config.backend == "redis":
            from esr_cache.redis_store import RedisStore

            assert config.redis_url is not None
            self.shared = RedisStore(config.redis_url, config.ttl_s, config.redis_timeout_ms / 1000.0)
        self._tasks: set[asyncio.Task] = set()  # writes under way, and the index's follower

    def use_encoder(self, encoder: str) -> None:
        """The encoder whose vectors the semantic index compares: another's clears it (a vector of
        one model means nothing to another's)."""
        if self.index.use_encoder(encoder):
            log.info("semantic cache index cleared: the encoder changed")
            self._count_bytes()

    def _count_bytes(self) -> None:
        metrics.BYTES.set(self.memory.bytes + self.index.bytes)

    def start(self) -> None:
        """On the event loop: a shared store's semantic entries start flowing into the index."""
        if self.shared is not None:
            self._spawn(self.shared.follow(self.index))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.shared is not None:
            await self.shared.close()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _get(self, key: str) -> Entry | None:
        if self.shared is None:
            return self.memory.get(key)
        try:
            return await self.shared.get(key)
        except StoreUnavailable:
            metrics.SKIPS.labels("store_unavailable").inc()
            return None

    def tenant(self, headers: Mapping[str, str]) -> str:
        return tenant_of(headers, self.config.tenant_header)

    async def lookup(self, key: str, stream: bool, turn: Turn | None = None,
                     threshold: float | None = None) -> tuple[bytes, dict[str, str]] | None:
        """The replay of a hit (body, headers), or None: the same request's answer, else (given its
        last turn) the answer to the closest earlier turn in the turn's scope."""
        entry, match = await self._get(key), "exact"
        if entry is None and turn is not None:
            near = self.index.nearest(turn.scope, turn.vector,
                                      self.config.semantic_threshold if threshold is None else threshold, turn.length)
            entry, match = (await self._get(near[0]) if near else None), "semantic"
            if near is not None and entry is None and self.shared is not None:
                self.index.remove(near[0])  # its answer expired in Redis (or was evicted there)
                self._count_bytes()
        metrics.LOOKUPS.labels("miss" if entry is None else ("hit" if match == "exact" else "semantic_hit")).inc()
        if entry is None:
            return None
        age = max(0.0, time.time() - entry.stored_at)
        metrics.HIT_AGE.observe(age)
        metrics.SAVED.inc(entry.upstream_s)
        body = answers.as_sse(entry.answer) if stream else answers.as_json(entry.answer)
        return body, {"content-type": "text/event-stream" if stream else "application/json",
                      "x-semantic-cache": "hit", "x-semantic-cache-match": match, "age": str(int(age))}

    def keep(self, key: str, raw: bytes, upstream_s: float, turn: Turn | None = None) -> None:
        """Keeps a whole 200 answer (JSON or an event stream) for `key` (in Redis: written in the
        background, the answer already on its way)."""
        self._store(key, answers.read(raw), len(raw), upstream_s, turn)

    def keep_soon(self, key: str, raw: bytes, upstream_s: float, turn: Turn | None = None) -> None:
        """keep, with an answer larger than READ_INLINE read on a thread: a long stream's events
        (a 1 MiB answer: ~10,000) must not hold the event loop while they are added up. Never
        raises: the answer is already on its way, only its keeping can fail."""
        if len(raw) > READ_INLINE:
            self._spawn(self._keep_read_aside(key, raw, upstream_s, turn))
            return
        try:
            self.keep(key, raw, upstream_s, turn)
        except Exception as exc:
            self._keep_failed(exc)

    async def _keep_read_aside(self, key: str, raw: bytes, upstream_s: float, turn: Turn | None) -> None:
        try:
            self._store(key, await asyncio.to_thread(answers.read, raw), len(raw), upstream_s, turn)
        except Exception as exc:
            self._keep_failed(exc)

    @staticmethod
    def _keep_failed(exc: Exception) -> None:
        log.warning("response cache keep failed", extra={"error": type(exc).__name__})
        metrics.SKIPS.labels("error").inc()

    def _store(self, key: str, read: answers.Read, size: int, upstream_s: float, turn: Turn | None) -> None:
        answer, why = read
        if answer is None:
            metrics.SKIPS.labels(why).inc()
            return
        entry = Entry(answer, size, upstream_s)
        if self.shared is not None:
            self._spawn(self._put_shared(key, entry, turn))
            return
        self.memory.put(key, entry)
        if turn is not None and key in self.memory:
            self.index.add(turn.scope, turn.vector, key, turn.length)
        metrics.STORES.inc()
        self._count_bytes()

    async def _put_shared(self, key: str, entry: Entry, turn: Turn | None) -> None:
        assert self.shared is not None
        try:
            await self.shared.put(key, entry)
            if turn is not None:
                self.index.add(turn.scope, turn.vector, key, turn.length)
                self._count_bytes()
                await self.shared.publish(turn, key, self.index.encoder or "")
        except StoreUnavailable:
            metrics.SKIPS.labels("store_unavailable").inc()
            return
        metrics.STORES.inc()

    @staticmethod
    def skipped(reason: str) -> None:
        metrics.SKIPS.labels(reason).inc()
