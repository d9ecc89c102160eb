"""Turns a request's user turns into a routing decision within a deadline; `decide` never raises."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Awaitable, Callable, Sequence

import numpy as np

from batching import BatcherClosed, DeadlineExceeded, Embedder, ModelUnavailable, Overloaded, RemoteError
from router import metrics
from router.classifier import Decision, RouteClassifier
from router.capabilities import ModelChoice
from router.config import RoutingConfig
from router.embedding_cache import EmbeddingCache
from router.rules import RequestFacts, Rules
from router.selection import Feedback, selector_for
from router.static_tier import StaticTier

log = logging.getLogger(__name__)

NO_FACTS = RequestFacts()  # a request that asks nothing of a model: its route's first serves it


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
    def __init__(self, config: RoutingConfig, batcher: Embedder, classifier: RouteClassifier,
                 cache: EmbeddingCache | None = None, utterances: dict[str, np.ndarray] | None = None,
                 static: StaticTier | None = None, feedback: Feedback | None = None, learns: bool = False):
        """`cache`: one the engine a reload replaces used (embeddings do not depend on routes);
        `feedback`: the selection feedback of the engine a reload replaces (router/selection.feedback_for);
        `learns`: serving (selection feedback, where on, is taken; offline it is not);
        `utterances`: the routes' utterance embeddings, kept so a reload re-embeds only new ones;
        `static`: the cascade's first tier (None: the encoder decides every request)."""
        self.config = config
        self.static = static
        self.utterances = utterances or {}
        self.batcher = batcher
        self.classifier = classifier
        self.rules = Rules(config)
        # which of the decided route's models serves the request (by quality and price where selection is on)
        self.models = ModelChoice(config, selector_for(config.selection, feedback, learns))
        self.cache = cache if cache is not None else EmbeddingCache(config.cache_size)
        self.cache.resize(config.cache_size)
        # A pinned model is reported under the first route that sends to it first, else the first
        # that ranks it, else the default route.
        self._route_of_model: dict[str, str] = {}
        for route in config.routes:
            for model in route.models[1:]:
                self._route_of_model.setdefault(model, route.name)
        for route in reversed(config.routes):
            self._route_of_model[route.model] = route.name

    # Each decision comes out with the model that serves the request chosen (router/capabilities.py,
    # by what the request asks: `facts`), in the same call: the request does not come back for it.

    @property
    def feedback(self) -> Feedback | None:
        """Selection feedback (router/selection.py): its corrections so far and the ids it issues; None: off."""
        selector = self.models.selector
        return selector.feedback if selector is not None else None

    def default(self, reason: str, facts: RequestFacts = NO_FACTS) -> Decision:
        return self.models.choose(self.classifier.default(reason), facts)

    def fallback(self, reason: str, guess: Decision | None, facts: RequestFacts = NO_FACTS) -> Decision:
        """Where the encoder could not answer: the static tier's guess (StaticTier.weigh) under the
        fallback's reason, so a busy router still routes; without one, the default route."""
        if guess is None:
            return self.default(reason, facts)
        metrics.child(metrics.DECISIONS_BY_TIER, guess.tier).inc()
        return self.models.choose(dataclasses.replace(guess, reason=reason), facts)

    def pinned(self, model: str, facts: RequestFacts = NO_FACTS) -> Decision:
        """The decision for a request that names a backend model itself (route REFUSED where the
        model cannot serve what the request asks)."""
        pinned = Decision(self._route_of_model.get(model, self.config.default_route.name), model, 1.0, "model_pinned")
        return self.models.choose(pinned, facts)

    def ruled(self, text: str, facts: RequestFacts) -> Decision | None:
        """The decision of the config's rules or a route's keywords (router/rules.py), if one matches."""
        decided = self.rules.decide(text, facts)
        return None if decided is None else self.models.choose(decided, facts)

    async def embed(self, text: str, deadline: float, bulk: bool = False) -> np.ndarray:
        """Through the cache. Raises RoutingUnavailable, whatever went wrong (a model failure must
        never reach the request path as anything else). `bulk`: one of a filter's many texts
        (batching's WorkItem.bulk)."""
        try:
            return await self.cache.get(text, lambda: self.batcher.embed(text, deadline, bulk))
        except Exception as exc:
            raise RoutingUnavailable(_fallback_reason(exc)) from exc

    async def decide(
        self, turns: Sequence[str], deadline: float, embed_last: Callable[[], Awaitable[np.ndarray]] | None = None,
        facts: RequestFacts = NO_FACTS, on_guess: Callable[[Decision], None] | None = None,
    ) -> Decision:
        """The routing decision, the one the server (the semantic_route filter), eval, fit, replay
        and the benches all make: the rules on the request's own turn (the last of `turns`, its user
        turns oldest first: router/conversation.py), the default route where it has none, the static
        tier (first_tier), then the encoder (by_encoder). `embed_last` embeds the request's own turn
        where a caller shares its embedding (it raises RoutingUnavailable as `embed` does); earlier
        turns that cannot be embedded now are left out, and without the last one the request falls
        back. `on_guess` is given the static tier's guess before the encoder is asked, for a caller
        whose wait may end first (the filter chain's deadline then routes by it: fallback)."""
        ruled = self.ruled(turns[-1] if turns else "", facts)
        if ruled is not None:
            return ruled
        if not turns:
            return self.default("no_prompt", facts)
        decided, guess = self.first_tier(turns, facts)
        if decided is not None:
            return decided
        if on_guess is not None and guess is not None:
            on_guess(guess)
        return await self.by_encoder(turns, deadline, guess, embed_last, facts)

    def first_tier(self, turns: Sequence[str], facts: RequestFacts = NO_FACTS) -> tuple[Decision | None, Decision | None]:
        """The static tier's decision where it stands, and its guess for a fallback (StaticTier.weigh);
        (None, None) without a tier."""
        metrics.CONVERSATION_TURNS.observe(len(turns))
        if self.static is None:
            return None, None
        decided, guess, vector = self.static.weigh(turns)
        if decided is None:
            return None, guess
        metrics.child(metrics.DECISIONS_BY_TIER, decided.tier).inc()
        return self.models.choose(decided, facts, vector, static=True), guess

    async def by_encoder(self, turns: Sequence[str], deadline: float, guess: Decision | None = None,
                         embed_last: Callable[[], Awaitable[np.ndarray]] | None = None,
                         facts: RequestFacts = NO_FACTS) -> Decision:
        """The encoder's decision, or a fallback routed by `guess` (fallback)."""
        if time.monotonic() >= deadline:
            # Late before the encoder is asked (it waited in front of the router): refused at once,
            # as the batcher refuses a request it predicts late, before the wait for a task would
            # let the request's own timeout end it unrouted.
            return self.fallback("fallback_overload", guess, facts)
        last = embed_last() if embed_last else self.embed(turns[-1], deadline)
        if len(turns) == 1:  # no task to start: a refusal comes back before the request's timeout can fire
            try:
                found: list = [await last]
            except RoutingUnavailable as exc:
                found = [exc]
        else:
            found = await asyncio.gather(*(self.embed(t, deadline) for t in turns[:-1]), last, return_exceptions=True)
        if isinstance(found[-1], BaseException):
            if isinstance(found[-1], RoutingUnavailable):
                return self.fallback(found[-1].reason, guess, facts)
            raise found[-1]
        embedded = [e for e in found if not isinstance(e, BaseException)]
        # One turn (most requests): its row as it is, no copy.
        scores = self.classifier.scores(embedded[0][None, :] if len(embedded) == 1 else np.stack(embedded))
        decided = self.classifier.conversation_decision(scores, self.config.conversation.gate)
        metrics.child(metrics.DECISIONS_BY_TIER, decided.tier).inc()
        return self.models.choose(decided, facts, embedded[-1])
