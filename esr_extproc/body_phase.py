"""A request's body phase: the whole body read, decided by the filter chain, and answered."""

from __future__ import annotations

import contextlib
import logging
import time

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from esr_cache.keys import tenant_of
from esr_extproc import metrics, replies, routed_answer
from esr_extproc.body_parser import BodyParser
from esr_extproc.cache_lookup import cached_answer, handed_off
from esr_extproc.feedback_answer import feedback_answer
from esr_extproc.json_scan import AMBIGUOUS, BadBody
from esr_extproc.records import DecisionRecorder
from esr_extproc.request_reader import read_request, unread
from esr_extproc.routed_answer import refusal
from esr_extproc.serving import Serving
from esr_extproc.stream import RequestStream
from esr_extproc.tracing import Tracing, decision_attributes

log = logging.getLogger(__name__)

# Bodies refused outright, with their status, rather than routed to the default: backends would
# read them differently from the router (json_scan.AMBIGUOUS) or not at all. Any other unusable
# body goes through the chain unread: a guard decides it by its on_error, else the default route.
REFUSED = {**dict.fromkeys(AMBIGUOUS, 400), "bad_encoding": 400, "inflated_too_large": 413}


def _span(tracing: Tracing | None, name: str):
    return tracing.span(name) if tracing is not None else contextlib.nullcontext()


async def answer_body(stream: RequestStream, current: Serving | None, bodies: BodyParser,
                      records: DecisionRecorder | None, tracing: Tracing | None) -> pb.ProcessingResponse:
    """The answer to a request's whole body (`decide`), in its trace span where traces are on."""
    if tracing is None:
        return await decide(stream, current, bodies, records, None)
    with tracing.request(stream.trace_metadata) as span:
        response = await decide(stream, current, bodies, records, tracing)
        if stream.outcome is not None:
            span.set_attributes(decision_attributes(*stream.outcome))
        return response


async def decide(stream: RequestStream, current: Serving | None, bodies: BodyParser,
                 records: DecisionRecorder | None, tracing: Tracing | None) -> pb.ProcessingResponse:
    """The answer to a request's whole body: read, decided by the filter chain, answered (routed,
    refused, or from the response cache), recorded; a score for selection feedback is answered by
    the router itself."""
    if stream.feedback_call:
        return await feedback_answer(stream, current, records)
    started = time.perf_counter()
    if current is None:  # model still loading: let Envoy's default route take it
        metrics.REQUESTS.labels("not_ready").inc()
        return replies.body_undecided("not_ready")
    engine = current.engine
    deadline = stream.started + current.settings.deadline_s
    raw = b"".join(stream.body)
    try:
        with _span(tracing, "semantic_router.read_body"):
            read = await read_request(bodies, stream.path, stream.headers, raw, stream.encoding, current,
                                      deadline, cache=stream.cache is not None, facts=records is not None)
    except BadBody as bad:
        metrics.BAD_REQUESTS.labels(bad.kind).inc()
        log.debug("unusable request body", extra={"kind": bad.kind, "path": stream.path})
        if bad.kind in REFUSED:  # ambiguous or unreadable to backends: refused, never forwarded
            return refusal(REFUSED[bad.kind], f"Invalid request body: {bad}", bad.kind)
        read = unread(stream.path, stream.headers, raw, engine, deadline, "invalid_body")
    ctx = read.ctx
    read_at = time.perf_counter()
    with _span(tracing, "semantic_router.filter_chain"):
        failure = await current.chain.run(ctx, tracing.span if tracing is not None else None)
    if failure is not None:
        metrics.FILTER_FAILURES.labels(failure).inc()
    # A decision an earlier filter made stands, also past a failure (a pinned model must reach
    # its own backend, which the body names); only an undecided request takes the default route.
    decision = ctx.decision or engine.default(failure or "default", ctx.facts)
    refused = routed_answer.unservable(decision)
    if refused is not None:
        return refused
    decided_at = time.perf_counter()
    with _span(tracing, "semantic_router.cache_lookup") if stream.cache is not None else contextlib.nullcontext():
        hit = await cached_answer(stream.cache, read, decision, current.settings)
    response = hit if hit is not None else routed_answer.routed(ctx, read.wire, decision, current.settings)
    # With tracing, a sampled request's time carries its trace id (an OpenMetrics exemplar):
    # Grafana links a slow one to its trace.
    traced = tracing.exemplar() if tracing is not None else None
    metrics.PROCESSING.observe(time.perf_counter() - started, exemplar=traced)
    cached = None if stream.cache is None else "hit" if hit else "miss" if stream.cache.key else "skipped"
    stream.outcome = (decision, ctx.requested_model, cached)
    if records is not None and records.wants():
        tenant = stream.cache.tenant if stream.cache is not None else \
            tenant_of(stream.headers, current.settings.cache.tenant_header)  # hashed once
        records.record_decision(ctx, decision, tenant, cached, (started, read_at, decided_at),
                                traced["trace_id"] if traced else None)
    return handed_off(stream.cache, response)
