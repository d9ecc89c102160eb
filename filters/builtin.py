"""The built-in request filters: model policy, semantic route, body size limit, prompt guard."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from filters.context import ImmediateReply, RequestContext
from filters import metrics
from router.guard_pieces import GUARD_MAX_PIECES
from router.classifier import Decision
from router.engine import RoutingEngine, RoutingUnavailable
from router.static_tier import StaticTier
from router.guard import GuardHead, GuardScorer, StaticScreen
from esr_settings import SettingError, build

log = logging.getLogger(__name__)


def openai_error(status: int, message: str, code: str, param: str | None = None, kind: str = "invalid_request_error") -> ImmediateReply:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return ImmediateReply(status, json.dumps(body).encode())


class ModelPolicy:
    """`auto` (and aliases) is routed; a backend model is pinned; an unknown model is routed or refused."""

    name = "model_policy"

    def __init__(self, settings: dict | None = None):
        build(_NoSettings, settings, f"filter_settings.{self.name}")

    async def __call__(self, ctx: RequestContext) -> None:
        cfg = ctx.engine.config
        model = ctx.requested_model
        if model in cfg.backend_models:
            ctx.decision = ctx.engine.pinned(model, ctx.facts)
        elif model is None or model in cfg.requests.model_aliases or cfg.requests.unknown_model == "route":
            ctx.rewrite_model = True
        else:
            ctx.immediate = openai_error(
                400, f"The model `{model}` does not exist on this gateway.", "model_not_found", param="model"
            )


class SemanticRoute:
    """Routes on the request's user turns unless an earlier filter already decided (the service
    then writes the decision's model into the body when the model policy asked for it)."""

    name = "semantic_route"

    def __init__(self, settings: dict | None = None):
        build(_NoSettings, settings, f"filter_settings.{self.name}")

    async def __call__(self, ctx: RequestContext) -> None:
        if ctx.decision is not None:
            return
        if ctx.unread is not None:  # nothing was read to route on
            ctx.decision = ctx.engine.default(ctx.unread, ctx.facts)
            return

        def keep(guess: Decision) -> None:
            ctx.guess = guess

        ctx.decision = await ctx.engine.decide(ctx.turns, ctx.deadline, ctx.embedding, ctx.facts, on_guess=keep)

    def undecided(self, ctx: RequestContext, why: str) -> None:
        """The chain ran out of time (or a filter raised) while the encoder had the request: the
        static tier's guess routes it, where it made one (engine.fallback)."""
        if ctx.decision is None and ctx.guess is not None:
            ctx.decision = ctx.engine.fallback(why, ctx.guess, ctx.facts)


@dataclass(frozen=True)
class _NoSettings:
    pass


@dataclass(frozen=True)
class BodySizeSettings:
    max_bytes: int = 1024 * 1024

    def __post_init__(self):
        if self.max_bytes < 1:
            raise SettingError("max_bytes", "must be at least 1")


class BodySizeLimit:
    """Refuses request bodies above `max_bytes` with an OpenAI-style 413."""

    name = "body_size_limit"

    def __init__(self, settings: dict | None = None):
        self.settings = build(BodySizeSettings, settings, f"filter_settings.{self.name}")

    async def __call__(self, ctx: RequestContext) -> None:
        if ctx.body_bytes > self.settings.max_bytes:
            ctx.immediate = openai_error(
                413, f"Request body is {ctx.body_bytes} bytes; this gateway accepts at most {self.settings.max_bytes}.",
                "request_too_large",
            )


@dataclass(frozen=True)
class PromptGuardSettings:
    exemplars: tuple[str, ...] = ()
    # A head fitted by `semantic-router fit` on guard data (`make guard`); when set, pieces score
    # the probability of an attack instead of their similarity to the exemplars.
    head: GuardHead | None = None
    # Written by `fit` beside a head where the static tier serves: a request it clears is let on
    # without the encoder (docs/static-tier.md#the-guards-static-screen). None: every request is
    # embedded.
    static_screen: StaticScreen | None = None
    threshold: float = 0.8
    action: Literal["block", "tag"] = "block"
    header: str = "x-prompt-guard"
    # When the guard cannot decide (the body was not read, the model is overloaded or failed, more
    # pieces than max_pieces): `allow` lets the request on (routed as usual, which says why),
    # `block` refuses it (403, code prompt_guard_unavailable).
    on_error: Literal["allow", "block"] = "allow"
    # Pieces scored per request: a 30 KB agent system prompt is ~800 (sentences and pairs), embedded
    # once and then read from the embedding cache (`cache_size`: keep it above what traffic repeats).
    max_pieces: int = 2048

    def __post_init__(self):
        if not self.exemplars and self.head is None:
            raise SettingError("exemplars", "needs at least one blocked exemplar (or a fitted head)")
        if not -1.0 <= self.threshold <= 1.0:
            raise SettingError("threshold", "must be between -1 and 1")
        if not 1 <= self.max_pieces <= GUARD_MAX_PIECES:
            raise SettingError("max_pieces", f"must be between 1 and {GUARD_MAX_PIECES}")


class PromptGuard:
    """Blocks (403) or tags requests any of whose text is close to a blocked exemplar.

    It reads what the backend model reads: every role's messages, system prompts, tool results and
    arguments, harness blocks (their markup cut; routing cuts the whole block), each split into
    pieces scored on their own (router.guard_pieces), so an injection is neither diluted by
    filler nor truncated away, wherever it sits. Pieces are embedded through the shared batcher
    and cache (the request's own prompt among them costs routing nothing more).
    """

    name = "prompt_guard"
    reads_all_text = True

    def __init__(self, settings: dict | None = None):
        self.settings = build(PromptGuardSettings, settings, f"filter_settings.{self.name}")
        self._scorer: GuardScorer | None = None
        self._static = None  # the static embedding the screen reads, where it serves

    async def setup(self, engine: RoutingEngine) -> None:
        """Embed the exemplars through the shared batcher (the model thread owns the model)."""
        self._scorer = await guard_scorer(self.settings, engine.embed)
        self._static = screen_embedding(self.settings.static_screen, engine.static)

    async def __call__(self, ctx: RequestContext) -> None:
        if self._scorer is None:
            return
        if ctx.unread is not None:
            return self.undecided(ctx, ctx.unread)
        pieces = ctx.guard_pieces
        if not pieces:
            return
        if len(pieces) > self.settings.max_pieces:
            return self.undecided(ctx, "too_many_pieces")
        if self._static is not None and self.settings.static_screen.clears(self._static, pieces):
            metrics.GUARD_SCREENED.inc()
            return
        try:
            found = await ctx.embeddings(pieces)
        except RoutingUnavailable as failed:
            return self.undecided(ctx, failed.reason)
        score = self._scorer.score(np.stack(found))
        if score < self.settings.threshold:
            return
        if self.settings.action == "tag":
            ctx.extra_headers[self.settings.header] = f"flagged;score={score:.3f}"
        else:
            ctx.immediate = openai_error(
                403, "This request was blocked by the gateway's prompt policy.", "content_policy_violation",
                kind="content_filter",
            )

    def undecided(self, ctx: RequestContext, why: str) -> None:
        """Refuses or lets on what the guard could not examine (the chain calls it when the deadline
        or an error stops the guard before it finished), and counts why."""
        metrics.GUARD_UNDECIDED.labels(why, self.settings.on_error).inc()
        if self.settings.on_error == "block":
            ctx.immediate = openai_error(
                403, "The gateway's prompt policy could not examine this request; retry later.",
                "prompt_guard_unavailable", kind="content_filter")


def screen_embedding(screen: StaticScreen | None, static: StaticTier | None):
    """The static embedding `screen` reads (the static tier's), or None where it cannot serve: no
    screen, no static tier, or a tier whose table is not the one the screen was fitted on (refit
    the guard after the table: a head on other vectors would clear what it should not). Serving's
    and eval's alike."""
    if screen is None:
        return None
    encoder = static.embedding if static is not None else None
    if encoder is None or getattr(encoder, "digest", None) != screen.table:
        log.warning("prompt_guard.static_screen is off: " + ("no static tier serves" if encoder is None else
                    "fitted on another static table (run fit on the guard data again)"))
        return None
    if encoder.dimension != screen.dimension:
        raise ValueError(f"filter_settings.prompt_guard.static_screen: takes {screen.dimension}-dimension "
                         f"embeddings; the static tier gives {encoder.dimension}")
    return encoder.encode


async def guard_scorer(settings: PromptGuardSettings, embed) -> GuardScorer:
    """The guard's scorer; `embed(text, deadline)` embeds its exemplars (a head needs none)."""
    deadline = time.monotonic() + 60.0
    if settings.head is not None:
        scorer = GuardScorer(head=settings.head)
        given = (await embed("dimension probe", deadline)).shape[-1]
        if given != scorer.dimension:  # a head fitted on another encoder's embeddings
            raise ValueError(f"filter_settings.prompt_guard.head: takes {scorer.dimension}-dimension embeddings; "
                             f"the encoder gives {given}")
        return scorer
    return GuardScorer(exemplars=np.stack([await embed(text, deadline) for text in settings.exemplars]))
