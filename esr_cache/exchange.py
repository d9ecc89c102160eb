"""One request's exchange with the response cache, across the three ext_proc phases it spans: at
its headers, whether it may be answered or kept at all (the chat completions API, no opt-out, its
tenant); at its body, the lookup of the request as it will be forwarded (a hit answers it, a miss
remembers the key its answer is kept under); on the way back, the answer gathered and kept once
whole. The matching policy (which routes match semantically, at what threshold) is the one the
request is served with, so it swaps with the routes on a reload."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import numpy as np

from esr_cache.cache import ResponseCache, opted_out
from esr_cache.config import CacheConfig
from esr_cache.keys import member_digest, request_key, scope_key
from esr_cache.semantic import Turn, turn_length

log = logging.getLogger(__name__)

# The requests whose answers the cache keeps (the chat completions API).
CACHED_PATH = "/v1/chat/completions"

Embed = Callable[[str], Awaitable["np.ndarray | None"]]  # a turn's embedding; None: not to be had now


@dataclass(frozen=True)
class CacheView:
    """What the cache keys a body on, made where the body is parsed (for a large body, in the
    parser's worker), so keying decodes nothing on the event loop: a digest of each top-level
    member's bytes as sent, of the conversation before its last message, and that message's text
    when it is a plain user turn the encoder reads whole (the only turns matched semantically)."""

    members: dict[str, str]  # name -> member_digest of its value's bytes
    history: str | None  # digest of `messages` up to its last element; None: no list of messages
    last_turn: str | None
    stream: bool


class CacheExchange:
    """Per request, from its headers to the end of its answer."""

    __slots__ = ("cache", "tenant", "kept_by_envoy", "key", "turn", "_sent_at", "_answer", "_answer_bytes")

    def __init__(self, cache: ResponseCache, tenant: str, kept_by_envoy: bool):
        self.cache = cache
        self.tenant = tenant
        self.kept_by_envoy = kept_by_envoy  # Envoy's keeper hands the answer back whole (esr_extproc/keeper.py)
        self.key: str | None = None  # set on a miss: the answer, once back, is kept under it
        self.turn: Turn | None = None  # semantic matching: the last user turn, embedded
        self._sent_at = 0.0
        self._answer: list[bytes] = []
        self._answer_bytes = 0

    @classmethod
    def open(cls, cache: ResponseCache | None, path: str, headers: Mapping[str, str],
             kept_by_envoy: bool) -> CacheExchange | None:
        """The exchange of a request that may be answered from the cache, or None."""
        if cache is None or path != CACHED_PATH:
            return None
        if opted_out(headers):
            cache.skipped("no_store")
            return None
        return cls(cache, cache.tenant(headers), kept_by_envoy)

    async def lookup(self, view: CacheView | None, body_changed: bool, model: str, route: str, policy: CacheConfig,
                     set_members: Mapping[str, bytes], embed: Embed) -> tuple[bytes, dict[str, str]] | None:
        """A cached answer (body, headers) to the request as forwarded to `model` (`set_members`: the
        members the route writes, as written), or None. A failure here costs the request its
        cache, never its routing."""
        if view is None or view.history is None:
            self.cache.skipped("unread_body")
            return None
        if body_changed:  # a filter rewrote the document: its bytes are not the ones keyed
            self.cache.skipped("changed_body")
            return None
        try:
            return await self._lookup(view, model, route, policy, set_members, embed)
        except Exception as exc:
            log.warning("response cache lookup failed", extra={"error": type(exc).__name__})
            self.cache.skipped("error")
            self.key = None
            return None

    async def _lookup(self, view: CacheView, model: str, route: str, policy: CacheConfig,
                      set_members: Mapping[str, bytes], embed: Embed) -> tuple[bytes, dict[str, str]] | None:
        assert view.history is not None
        # Keyed on the body as forwarded: the route's set_body members are what the backend reads.
        members = {**view.members, **{name: member_digest(value) for name, value in set_members.items()}}
        key = request_key(self.tenant, model, members)
        if route in policy.semantic and view.last_turn is not None:
            vector = await embed(view.last_turn)  # routing has usually embedded this turn already
            if vector is not None:  # else exact matching only, this once
                self.turn = Turn(scope_key(self.tenant, model, members, view.history), vector,
                                 turn_length(view.last_turn))
        hit = await self.cache.lookup(key, view.stream, self.turn, policy.threshold_of(route))
        if hit is None:
            self.key = key
        return hit

    def sent(self) -> None:
        """The request went on to its backend: what the backend takes from here is what a hit saves."""
        self._sent_at = time.monotonic()

    def hand_to_keeper(self) -> tuple[str, float]:
        """The key and when the request left, for Envoy's keeper; nothing comes through this stream."""
        key, self.key = self.key, None
        assert key is not None
        return key, time.time()

    def on_answer(self, chunk: bytes, end: bool) -> None:
        """A chunk of the backend's answer, as it streams past."""
        if self.key is None:
            return
        self._answer_bytes += len(chunk)
        if self._answer_bytes > self.cache.config.max_entry_bytes:
            self.cache.skipped("too_large")
            self.key, self._answer = None, []
            return
        self._answer.append(chunk)
        if end:
            self.cache.keep_soon(self.key, b"".join(self._answer), time.monotonic() - self._sent_at, self.turn)
            self.key, self._answer = None, []
