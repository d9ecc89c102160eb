"""What the service asks of the response cache for a decided request: its answer, looked up on the
body as it will be forwarded, with the turn's vector routing already has (or embeds now); and, once
answered, the hand-off of the answer to come (to this stream, or to Envoy's keeper)."""

from __future__ import annotations

import numpy as np
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from esr_cache.exchange import CacheExchange
from esr_extproc import replies, routed_answer
from esr_extproc.body_rewrite import set_body
from esr_extproc.json_scan import member_bytes
from esr_extproc.keeper import entry_token
from esr_extproc.request_reader import ReadRequest
from esr_extproc.serving import ServiceSettings
from router.classifier import Decision
from router.engine import RoutingUnavailable


async def cached_answer(exchange: CacheExchange | None, read: ReadRequest, decision: Decision,
                        settings: ServiceSettings) -> pb.ProcessingResponse | None:
    """A cached answer to this request, or None (on a miss the exchange remembers its key)."""
    ctx = read.ctx
    if exchange is None or ctx.immediate is not None:
        return None

    async def embed(text: str) -> np.ndarray | None:
        known = ctx.embedded(text)  # routing has usually embedded this turn already
        if known is not None:
            return known
        try:
            return await ctx.engine.embed(text, ctx.deadline)
        except RoutingUnavailable:
            return None

    view = read.cache_view if ctx.unread is None else None
    written = {name: member_bytes(value) for name, value in set_body(ctx, decision, settings).items()}
    hit = await exchange.lookup(view, ctx.body_changed, decision.model, decision.route, settings.cache, written, embed)
    return routed_answer.cache_hit(*hit, decision) if hit is not None else None


def handed_off(exchange: CacheExchange | None, response: pb.ProcessingResponse) -> pb.ProcessingResponse:
    """`response` as sent on a miss the cache will keep: its clock started, and where Envoy's keeper
    keeps the answer (nothing comes back through this stream), the entry named in the response."""
    if exchange is None or exchange.key is None:
        return response
    exchange.sent()
    if not exchange.kept_by_envoy:
        return response
    turn = exchange.turn
    return replies.naming_cache_entry(response, entry_token(*exchange.hand_to_keeper(), turn))
