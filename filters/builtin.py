"""The built-in request filters: model policy, semantic route, body size limit, prompt guard."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from filters.context import ImmediateReply, RequestContext
from router.engine import RoutingEngine, RoutingUnavailable
from router.settings_loader import SettingError, build

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
            ctx.decision = ctx.engine.pinned(model)
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
        if ctx.decision is None:
            if not ctx.turns:
                ctx.decision = ctx.engine.default(ctx.unread or "no_prompt")
            else:
                ctx.decision = await ctx.engine.decide(ctx.turns, ctx.deadline, ctx.embedding)


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
    threshold: float = 0.8
    action: Literal["block", "tag"] = "block"
    header: str = "x-prompt-guard"

    def __post_init__(self):
        if not self.exemplars:
            raise SettingError("exemplars", "needs at least one blocked exemplar")
        if not -1.0 <= self.threshold <= 1.0:
            raise SettingError("threshold", "must be between -1 and 1")


class PromptGuard:
    """Blocks (403) or tags prompts whose embedding is close to a blocked exemplar.

    Uses the same prompt embedding as routing (computed once). Fails open: without an embedding
    (overload, deadline, shutdown, a model error) the request is routed as usual, which reports why.
    """

    name = "prompt_guard"

    def __init__(self, settings: dict | None = None):
        self.settings = build(PromptGuardSettings, settings, f"filter_settings.{self.name}")
        self._exemplars: np.ndarray | None = None

    async def setup(self, engine: RoutingEngine) -> None:
        """Embed the exemplars through the shared batcher (the model thread owns the model)."""
        deadline = time.monotonic() + 60.0
        vectors = [await engine.embed(text, deadline) for text in self.settings.exemplars]
        self._exemplars = np.stack(vectors)

    async def __call__(self, ctx: RequestContext) -> None:
        if ctx.prompt is None or self._exemplars is None:
            return
        try:
            embedding = await ctx.embedding()
        except RoutingUnavailable:  # overload, deadline, shutdown or a model failure: fail open
            return
        score = float((self._exemplars @ embedding).max())
        if score < self.settings.threshold:
            return
        if self.settings.action == "tag":
            ctx.extra_headers[self.settings.header] = f"flagged;score={score:.3f}"
        else:
            ctx.immediate = openai_error(
                403, "This request was blocked by the gateway's prompt policy.", "content_policy_violation",
                kind="content_filter",
            )
