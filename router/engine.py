"""Turns a prompt into a routing decision within a deadline; `decide` never raises."""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import numpy as np

from batching import BatcherClosed, DeadlineExceeded, Embedder, ModelUnavailable, Overloaded, RemoteError
from router import metrics
from router.classifier import Decision, RouteClassifier
from router.config import RouterConfig
from router.decision_cache import LRUCache

log = logging.getLogger(__name__)

_CACHEABLE_CHARS = 8192  # longer prompts are rare repeats and would pin memory in the cache


class RoutingUnavailable(Exception):
    """No embedding for this prompt: the batcher is overloaded, the deadline passed, the router is
    shutting down, the model process is away, or the model failed. `reason` is the fallback reason a request reports."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _fallback_reason(exc: Exception) -> str:
    if isinstance(exc, Overloaded):  # queue full, or predicted to answer after the deadline
        return "fallback_overload"
    if isinstance(exc, DeadlineExceeded):
        return "fallback_timeout"
    if isinstance(exc, BatcherClosed):
        return "fallback_shutdown"
    if isinstance(exc, ModelUnavailable):  # the model process is restarting or gone
        return "fallback_unavailable"
    if isinstance(exc, RemoteError):  # the remote engine failed, or its circuit breaker is open
        return "fallback_remote"
    log.warning("embedding failed: %s", type(exc).__name__)
    return "fallback_error"


class RoutingEngine:
    def __init__(self, config: RouterConfig, batcher: Embedder, classifier: RouteClassifier):
        self.config = config
        self.batcher = batcher
        self.classifier = classifier
        self.cache: LRUCache[Decision] = LRUCache(config.cache_size)
        # A pinned model is reported under the first route that sends to it (else the default route).
        self._route_of_model: dict[str, str] = {}
        for route in reversed(config.routes):
            self._route_of_model[route.model] = route.name

    def default(self, reason: str) -> Decision:
        return self.classifier.default(reason)

    def pinned(self, model: str) -> Decision:
        """The decision for a request that names a backend model itself."""
        return Decision(self._route_of_model.get(model, self.config.default_route.name), model, 1.0, "model_pinned")

    async def embed(self, prompt: str, deadline: float) -> np.ndarray:
        """Raises RoutingUnavailable, whatever went wrong (a model failure must never reach the
        request path as anything else)."""
        try:
            return await self.batcher.embed(prompt, deadline)
        except Exception as exc:
            raise RoutingUnavailable(_fallback_reason(exc)) from exc

    async def decide(
        self, prompt: str, deadline: float, embed: Callable[[], Awaitable[np.ndarray]] | None = None
    ) -> Decision:
        """`embed` lets a caller share an embedding it already has (or will need) for `prompt`;
        it raises RoutingUnavailable as `embed` does."""
        cacheable = len(prompt) <= _CACHEABLE_CHARS and self.cache.size > 0
        if cacheable:
            hit = self.cache.get(prompt)
            metrics.CACHE.labels("hit" if hit else "miss").inc()
            if hit is not None:
                return hit
        try:
            embedding = await (embed() if embed else self.embed(prompt, deadline))
        except RoutingUnavailable as exc:
            return self.default(exc.reason)
        decision = self.classifier.classify(embedding)
        if cacheable:
            self.cache.put(prompt, decision)
        return decision
