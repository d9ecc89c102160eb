"""The answer to a request once its filters have decided: the router's headers and the body as it
is forwarded, a filter's immediate reply, a cached answer, or a refusal straight from the gateway."""

from __future__ import annotations

import logging

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from esr_extproc import metrics, replies
from esr_extproc.body_rewrite import WireBody, forwarded_body
from esr_extproc.headers import (CHAIN, CONFIDENCE, MODEL_AT, REASON, ROUTE, SCORE, SELECTED_MODEL, SELECTED_PRICE,
                                 SELECTED_QUALITY, SELECTION_ID, SKIPPED, TIER, TRUNCATED)
from esr_extproc.serving import ServiceSettings
from filters.builtin import openai_error
from filters.context import ImmediateReply, RequestContext
from router import capabilities
from router.classifier import Decision
from router.metrics import child

log = logging.getLogger(__name__)


def refusal(status: int, message: str, code: str) -> pb.ProcessingResponse:
    """An OpenAI-style error straight from the gateway; the request reaches no backend."""
    metrics.REQUESTS.labels("rejected").inc()
    return replies.immediate(openai_error(status, message, code), {})


def unservable(decision: Decision) -> pb.ProcessingResponse | None:
    """A 400 for a decision no configured model may serve (router/capabilities.py); None otherwise."""
    if decision.route != capabilities.REFUSED:
        return None
    metrics.BAD_REQUESTS.labels("no_capable_model").inc()
    return refusal(400, capabilities.refusal_message(decision), "no_capable_model")


def shed_refusal(why: str) -> pb.ProcessingResponse:
    """A call the router would shed where the undecided policy refuses (envoy.undecided): a 429 to
    retry, never a way past the guard."""
    metrics.REQUESTS.labels("rejected_overload").inc()
    reply = openai_error(429, "The gateway is busy; retry shortly.", "rate_limit_exceeded", kind="rate_limit_error")
    return replies.immediate(reply, {"retry-after": "1", REASON: why})


def cache_hit(body: bytes, headers: dict[str, str], decision: Decision) -> pb.ProcessingResponse:
    metrics.REQUESTS.labels("cache_hit").inc()
    route = {ROUTE: decision.route, SELECTED_MODEL: decision.model, REASON: decision.reason}
    return replies.immediate(ImmediateReply(200, body, headers), route, details="semantic_cache_hit")


def routed(ctx: RequestContext | None, wire: WireBody | None, decision: Decision, settings: ServiceSettings,
           at_headers: bool = False) -> pb.ProcessingResponse:
    """`ctx` None: decided at the headers, with no body to read."""
    if ctx is not None and ctx.immediate is not None:
        metrics.REQUESTS.labels("rejected").inc()
        return replies.immediate(ctx.immediate, _safe_extra(ctx))
    child(metrics.REQUESTS, decision.reason).inc()
    child(metrics.ROUTE_DECISIONS, decision.route).inc()
    headers = {
        SELECTED_MODEL: decision.model,
        ROUTE: decision.route,
        SCORE: f"{decision.score:.4f}",
        REASON: decision.reason,
        CONFIDENCE: f"{decision.confidence:.4f}",
        **settings.server.standard_headers(decision.model),
    }
    if decision.tier:
        headers[TIER] = decision.tier
    if decision.skipped:
        headers[SKIPPED] = ",".join(decision.skipped)
    if decision.predicted_quality is not None:
        headers[SELECTED_QUALITY] = f"{decision.predicted_quality:.3f}"
        headers[SELECTED_PRICE] = f"{decision.price:g}"
    if decision.selection_id is not None:
        headers[SELECTION_ID] = decision.selection_id
    new_body = None
    if ctx is not None and wire is not None:
        headers = {**_safe_extra(ctx), **headers}
        if ctx.truncated:
            metrics.PROMPT_TRUNCATED.inc()
            headers[TRUNCATED] = settings.requests.truncate  # which part was routed on
        new_body, model_at = forwarded_body(ctx, wire, decision, settings)
        if model_at is not None:  # Envoy may try other models: it needs to know where to write them
            headers[CHAIN], headers[MODEL_AT] = ",".join(decision.chain), str(model_at)
        if settings.log_prompts:
            log.debug("routed", extra={"route": decision.route, "reason": decision.reason, "prompt": ctx.prompt})
    if new_body is not None:
        headers["content-length"] = str(len(new_body))
    if at_headers:
        return replies.headers_routed(headers, decision.reason)
    plain = wire is not None and wire.inflated
    return replies.body_routed(headers, new_body, decision.reason, remove=("content-encoding",) if plain else ())


def _safe_extra(ctx: RequestContext) -> dict[str, str]:
    ok = {}
    for name, value in ctx.extra_headers.items():
        # x-gateway-*: the Inference Extension's (the endpoint picker's among them), never a filter's
        if replies.valid_header(name, value) and name not in replies.ROUTER_HEADERS \
                and not name.startswith("x-gateway-"):
            ok[name] = value
        else:
            log.warning("filter header dropped", extra={"header": name[:64]})
    return ok
