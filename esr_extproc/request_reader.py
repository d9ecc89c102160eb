"""Reads a request's body into what the filters see (RequestContext), within its deadline: inflated
if it came encoded, parsed on the loop or in the parser's worker, only peeked at for its model when
too large to parse. A body that cannot be read by the deadline still gets a context that says why,
so the chain runs on what is known and a filter that must examine every body can refuse it."""

from __future__ import annotations

from typing import NamedTuple

from esr_cache.exchange import CacheView
from esr_extproc import metrics
from esr_extproc.body_parser import BodyParser, ParserUnavailable, ParseTimeout
from esr_extproc.request_body import ReadOptions
from esr_extproc.body_rewrite import WireBody
from esr_extproc.serving import Serving
from filters.context import RequestContext
from router.engine import RoutingEngine
from router.rules import RequestFacts


class ReadRequest(NamedTuple):
    ctx: RequestContext  # what the filters read and decide
    wire: WireBody  # what travels on
    cache_view: CacheView | None  # what the response cache keys it on, when asked for


def unread_facts(raw: bytes) -> RequestFacts:
    """What a body nobody read asks of a model: its tokens a byte each in four, the estimate's upper
    end, so it is never sent to a model whose context it may not fit (router/capabilities.py);
    tools and images are not known."""
    return RequestFacts(prompt_tokens=len(raw) // 4)


def unread(path: str, headers: dict[str, str], raw: bytes, engine: RoutingEngine, deadline: float,
           why: str | None) -> ReadRequest:
    """A request with nothing read from its body yet (`why`: why nothing will be)."""
    ctx = RequestContext(path=path, headers=headers, body={}, requested_model=None, deadline=deadline, engine=engine,
                         body_bytes=len(raw), unread=why, facts=unread_facts(raw))
    return ReadRequest(ctx, WireBody(raw), None)


async def read_request(bodies: BodyParser, path: str, headers: dict[str, str], raw: bytes, encoding: str | None,
                       serving: Serving, deadline: float, cache: bool, facts: bool = False) -> ReadRequest:
    """BadBody for a body that cannot be used (esr_extproc.json_scan); `cache`: make its CacheView;
    `facts`: measure what rules read even where no rule reads it (for decision records)."""
    engine, chain, settings = serving
    read = unread(path, headers, raw, engine, deadline, None)
    ctx, wire = read.ctx, read.wire
    try:
        if encoding is not None:
            raw = await bodies.inflate(raw, encoding, settings.max_inflated_bytes, deadline)
            wire.raw, wire.inflated, ctx.body_bytes = raw, True, len(raw)
            ctx.facts = unread_facts(raw)
        if len(raw) > settings.requests.max_body_bytes:
            metrics.BAD_REQUESTS.labels("too_large").inc()
            ctx.unread = "body_too_large"
            ctx.requested_model, wire.model_span = await bodies.scan_unread(raw, deadline)
            return read
        wants_facts = engine.rules.reads_facts or engine.models.reads_facts or facts
        read_for = ReadOptions(settings.requests, engine.config.conversation.turns_read, chain.reads_all_text,
                               wants_facts, cache)
        parsed = await bodies.parse(raw, path, read_for, deadline)
    except ParseTimeout:
        # Not read by the deadline (a costly shape, a busy parser).
        metrics.BAD_REQUESTS.labels("parse_timeout").inc()
        ctx.unread = ctx.unread or "fallback_timeout"
        return read
    except ParserUnavailable:
        metrics.BAD_REQUESTS.labels("parser_failed").inc()
        ctx.unread = ctx.unread or "fallback_error"
        return read
    ctx.body, ctx.requested_model, wire.model_span = parsed.data, parsed.model, parsed.model_span
    ctx.turns, ctx.guard_pieces, ctx.truncated = parsed.turns, parsed.guard, parsed.truncated
    if parsed.facts is not None:
        ctx.facts = parsed.facts
    return read._replace(cache_view=parsed.cache)
