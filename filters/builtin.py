"""The built-in request filters: model policy and semantic routing."""

from __future__ import annotations

import json

from filters.context import ImmediateReply, RequestContext


def openai_error(status: int, message: str, code: str) -> ImmediateReply:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": "model", "code": code}}
    return ImmediateReply(status, json.dumps(body).encode())


class ModelPolicy:
    """`auto` (and aliases) is routed; a backend model is pinned; an unknown model is routed or refused."""

    name = "model_policy"

    async def __call__(self, ctx: RequestContext) -> None:
        cfg = ctx.engine.config
        model = ctx.requested_model
        if model in cfg.backend_models:
            ctx.decision = ctx.engine.pinned(model)
        elif model is None or model in cfg.requests.model_aliases or cfg.requests.unknown_model == "route":
            ctx.rewrite_model = True
        else:
            ctx.immediate = openai_error(
                400, f"The model `{model}` does not exist on this gateway.", "model_not_found"
            )


class SemanticRoute:
    """Classifies the prompt unless an earlier filter already decided; writes the model back."""

    name = "semantic_route"

    async def __call__(self, ctx: RequestContext) -> None:
        if ctx.decision is None:
            if ctx.prompt is None:
                ctx.decision = ctx.engine.default("no_prompt")
            else:
                ctx.decision = await ctx.engine.decide(ctx.prompt, ctx.deadline, ctx.embedding)
        if ctx.rewrite_model and ctx.body.get("model") != ctx.decision.model:
            ctx.body["model"] = ctx.decision.model
            ctx.body_changed = True
