"""What one request looks like to the filter chain, and what the filters decided about it."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from router.classifier import Decision
from router.engine import RoutingEngine, RoutingUnavailable
from router.rules import RequestFacts

EMBED_WAVE = 16  # a filter's texts in the batcher's queue at once, per request: a quarter of a batch


@dataclass
class ImmediateReply:
    """Answer the client directly; the request never reaches a backend."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})


@dataclass
class RequestContext:
    path: str
    headers: dict[str, str]
    body: MutableMapping[str, Any]  # the parsed JSON object; members decode when first read
    requested_model: str | None
    deadline: float  # time.monotonic() by which the answer must go back to Envoy
    engine: RoutingEngine
    body_bytes: int = 0
    turns: tuple[str, ...] = ()  # what routing reads, oldest first; empty: no user text
    facts: RequestFacts = RequestFacts()  # what rules and the model choice read (measured only where one does)
    truncated: bool = False  # a routed text is estimated longer than the encoder's window (prompt_max_tokens)
    # Every text the backend model reads, in pieces (router.guard_pieces), for filters with
    # reads_all_text; more than GUARD_MAX_PIECES: the parser stopped splitting.
    guard_pieces: tuple[str, ...] = ()
    # Why the body was not read (body_too_large): then `body` is empty, `prompt` None, and
    # `requested_model` what could be peeked at.
    unread: str | None = None
    decision: Decision | None = None
    # The static tier's guess (RoutingEngine.first_tier), once it has weighed the request: what a
    # fallback routes by where the encoder does not answer in time (filters/builtin.py, SemanticRoute).
    guess: Decision | None = None
    rewrite_model: bool = False  # set by the model policy: write the chosen model into the body
    body_changed: bool = False
    extra_headers: dict[str, str] = field(default_factory=dict)
    immediate: ImmediateReply | None = None
    _embedding: np.ndarray | RoutingUnavailable | None = None

    @property
    def prompt(self) -> str | None:
        """The request's own prompt (its last user turn): what prompt filters read."""
        return self.turns[-1] if self.turns else None

    def embedded(self, text: str) -> np.ndarray | None:
        """The vector of `text` where this request has it already (its prompt, once embedded)."""
        return self._embedding if text == self.prompt and isinstance(self._embedding, np.ndarray) else None

    async def embedding(self) -> np.ndarray:
        """The prompt's embedding, asked of the engine once: a failure is remembered like a result,
        so a second filter neither resubmits the prompt nor waits again. Raises RoutingUnavailable."""
        if self._embedding is None:
            try:
                self._embedding = await self.engine.embed(self.prompt or "", self.deadline)
            except RoutingUnavailable as exc:
                self._embedding = exc
        if isinstance(self._embedding, RoutingUnavailable):
            raise self._embedding
        return self._embedding

    async def embeddings(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Embeddings of a filter's own texts (the prompt guard's pieces): cached ones read at once,
        without a coroutine each, the rest embedded together, the request's prompt shared with
        routing. Raises RoutingUnavailable if any fails, and the prompt's embedding is then taken
        as failed too (if not yet computed): routing would meet the same deadline, overload or
        model error, so the request neither resubmits its text nor waits again."""
        found: list = [self.engine.cache.peek(t) for t in texts]
        missing = [i for i, vector in enumerate(found) if vector is None]
        computed: list = []
        # A wave at a time: a request with thousands of pieces holds at most EMBED_WAVE of the
        # batcher's queue slots, so others' requests join the batches between its waves instead of
        # finding the queue full (tests/router/test_filter_embeddings.py). As bulk texts: every
        # request's own prompt is batched and admitted before them (batching/queue.py).
        for start in range(0, len(missing), EMBED_WAVE):
            wave = missing[start:start + EMBED_WAVE]
            computed += await asyncio.gather(
                *(self.embedding() if texts[i] == self.prompt else self.engine.embed(texts[i], self.deadline, True)
                  for i in wave),
                return_exceptions=True)
            if any(isinstance(v, BaseException) for v in computed[-len(wave):]):
                break
        for i, vector in zip(missing, computed):
            if isinstance(vector, BaseException):
                if isinstance(vector, RoutingUnavailable) and self._embedding is None:
                    self._embedding = vector
                raise vector
            found[i] = vector
        return found
