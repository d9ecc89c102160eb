"""The Envoy ext_proc gRPC service: one stream per HTTP request, its messages answered in order
(headers, body, the answer's body for the response cache), the body through the filter chain."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from typing import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from esr_cache.cache import ResponseCache
from esr_cache.exchange import CacheExchange
from esr_cache.keys import tenant_of
from esr_extproc import encodings, metrics, replies, routed_answer
from esr_extproc.body_modes import (declared_over_limit, duplex_chunk, over_limit, part_past_buffer, refused_override,
                                    too_late_to_route, whole_before_trailers)
from esr_extproc.body_parser import BodyParser
from esr_extproc.cache_lookup import cached_answer
from esr_extproc.headers import CACHE_KEEPER, EPP_DESTINATION, LLM_PATHS, PINNED_NAMESPACE, REASON
from esr_extproc.json_scan import AMBIGUOUS, BadBody
from esr_extproc.keeper import entry_token
from esr_extproc.records import DecisionRecorder, decision_record
from esr_extproc.tracing import Tracing, decision_attributes
from esr_extproc.request_reader import read_request, unread
from esr_extproc.routed_answer import refusal, shed_refusal
from esr_extproc.serving import Serving
from esr_extproc.shedding import Admission, holders, waited_s
from esr_extproc.stream import RequestStream, canonical_path
from router import capabilities
from router.engine import RoutingEngine

log = logging.getLogger(__name__)

# Headers the body answer may add (the six router headers, content-length) plus one spare.
HEADER_HEADROOM = 8

# Bodies refused outright, with their status, rather than routed to the default: backends would
# read them differently from the router (json_scan.AMBIGUOUS) or not at all. Any other unusable
# body goes through the chain unread: a guard decides it by its on_error, else the default route.
REFUSED = {**dict.fromkeys(AMBIGUOUS, 400), "bad_encoding": 400, "inflated_too_large": 413}


@functools.lru_cache(maxsize=8)  # one set per configuration's standard headers
def _spoofable(standard: tuple[str, ...]) -> frozenset[str]:
    """Headers only the router (or, for the endpoint picker's, nobody on this path) may set."""
    return frozenset((*replies.ROUTER_HEADERS, *standard, EPP_DESTINATION))


class ExtProcService(pb_grpc.ExternalProcessorServicer):
    def __init__(self, process: str = "router", cache: ResponseCache | None = None,
                 records: DecisionRecorder | None = None, tracing: Tracing | None = None):
        self._streams = metrics.STREAMS.labels(process)
        self.cache = cache  # None: no response cache
        self.records = records  # None: no decision records
        self.tracing = tracing  # None: no traces
        # Swapped whole by a config reload (serve) without touching requests in flight. None until
        # the first engine is built.
        self.serving: Serving | None = None
        self._bodies = BodyParser()
        self.admission = Admission()  # LLM calls being decided (server.max_in_flight, server.client_share)

    def start(self) -> None:
        """Starts what serving needs beside the engine: the worker process for large bodies."""
        self._bodies.start()

    def serve(self, serving: Serving) -> None:
        self.serving = serving

    @property
    def in_flight(self) -> int:
        return self.admission.total

    @property
    def engine(self) -> RoutingEngine | None:
        return self.serving.engine if self.serving is not None else None

    def close(self) -> None:
        self._bodies.close()
        if self.records is not None:
            self.records.close()

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest], context) -> None:
        """One HTTP request's stream. Read and answered through grpc.aio's reader/writer calls: an
        async generator each way costs the loop its bookkeeping on every message."""
        stream = RequestStream()
        if self.tracing is not None:
            stream.trace_metadata = tuple(context.invocation_metadata() or ())
        self._streams.inc()
        try:
            while (request := await context.read()) is not grpc.aio.EOF:
                kind = request.WhichOneof("request")
                if request.HasField("protocol_config"):  # the first message says how Envoy sends bodies
                    stream.body_mode = request.protocol_config.request_body_mode
                if kind == "request_headers":
                    answer = self._on_headers(request.request_headers, stream,
                                              sheddable=PINNED_NAMESPACE in request.metadata_context.filter_metadata)
                    if stream.duplex and stream.llm_call and not request.request_headers.end_of_stream \
                            and answer.HasField("request_headers"):
                        # Full duplex: the headers answer waits for the whole body (it carries the route).
                        stream.held_headers = answer
                        continue
                    await context.write(answer)
                    if request.request_headers.end_of_stream and stream.llm_call:
                        return  # no body: answered at the headers phase
                elif kind == "request_body":
                    if not stream.method:  # Envoy sent no headers message (request_header_mode: SKIP)
                        stream.from_attributes(request)
                    chunk = request.request_body
                    stream.body.append(chunk.body)
                    stream.body_bytes += len(chunk.body)
                    if stream.duplex:
                        for answer in await duplex_chunk(stream, chunk.end_of_stream, self._limit(), self._on_body):
                            await context.write(answer)
                    elif chunk.end_of_stream or whole_before_trailers(stream):
                        self._admit(stream)
                        answer = over_limit(stream, self._limit()) or await self._on_body(stream)
                        self._release(stream)  # answered: what the stream waits for now is the backend's
                        await context.write(too_late_to_route(answer) if stream.unbuffered else answer)
                    elif (refused := part_past_buffer(stream, self._limit())) is not None:
                        self._release(stream)
                        await context.write(refused)
                    else:
                        if stream.streamed and stream.llm_call and not stream.unbuffered:
                            stream.unbuffered = True  # the body was asked for whole: the override was refused
                            refused_override()
                        await context.write(replies.body_continue())
                elif kind == "request_trailers" and stream.duplex and stream.held_headers is not None:
                    for answer in await duplex_chunk(stream, True, self._limit(), self._on_body, trailers=True):
                        await context.write(answer)
                    await context.write(replies.pass_through(kind))
                elif kind == "response_body" and stream.cache is not None and stream.cache.key is not None:
                    stream.cache.on_answer(request.response_body.body, request.response_body.end_of_stream)
                    await context.write(pb.ProcessingResponse(response_body=pb.BodyResponse()))
                else:
                    answer = replies.pass_through(kind)
                    if answer is not None:
                        await context.write(answer)
        finally:
            self._release(stream)

    def _admit(self, stream: RequestStream) -> None:
        """The whole body is here: from now to its answer the call holds a slot (shedding.Admission)."""
        if stream.holders is not None and not stream.admitted:
            stream.admitted = True
            self.admission.admit(stream.holders)

    def _release(self, stream: RequestStream) -> None:
        if stream.admitted and stream.holders is not None:
            stream.admitted = False
            self.admission.release(stream.holders)

    def _limit(self) -> int | None:
        """Envoy's own request limit, the most a held body may grow to (None: not serving yet)."""
        return self.serving.settings.max_inflated_bytes if self.serving is not None else None

    def _on_headers(self, headers: pb.HttpHeaders, stream: RequestStream, sheddable: bool = False
                    ) -> pb.ProcessingResponse:
        """`sheddable`: Envoy has read the body's `model` itself (PINNED_NAMESPACE), so a request shed
        here still reaches a model it pins; behind a gateway that does not, nothing is shed here."""
        h = replies.header_map(headers)
        stream.headers = h
        # The budget runs from when Envoy sent the request on (the rendered config's stamp): the wait
        # in gRPC's buffers before this loop read it is the client's wait too. Only behind the
        # rendered config (the pinned-model metadata says so): elsewhere a client could send an old
        # stamp, and a request out of time is one the guard decides by its on_error.
        waited = waited_s(h) if sheddable else 0.0  # also what shedding reads below
        stream.started -= waited
        stream.method = h.get(":method", "")
        stream.path = canonical_path(h.get(":path", ""))
        current = self.serving
        standard = current.settings.server.gateway_headers if current is not None else ()
        spoofed = not _spoofable(standard).isdisjoint(h)
        if spoofed:
            metrics.BAD_REQUESTS.labels("spoofed_router_header").inc()
        if not stream.llm_call:
            metrics.REQUESTS.labels("not_processed").inc()
            # On an LLM path (a GET, say) Envoy's LLM routes still take it: by the undecided policy.
            return replies.headers_skip_body(spoofed, standard, "not_processed" if stream.path.endswith(LLM_PATHS) else None)
        limit = current.settings.max_request_headers if current else None
        if limit is not None and len(headers.headers.headers) + HEADER_HEADROOM > limit:
            # Envoy would fail the request with a 500 once the router adds its headers.
            metrics.BAD_REQUESTS.labels("too_many_headers").inc()
            return refusal(431, f"Too many request headers: at most {limit - HEADER_HEADROOM} on this gateway.",
                           "request_header_fields_too_large")
        too_large = declared_over_limit(h, self._limit())
        if too_large is not None:
            return too_large
        encoding = h.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            if not encodings.supported(encoding):
                # Not readable here, and a backend that inflates it would get it unexamined.
                metrics.BAD_REQUESTS.labels("encoded").inc()
                return refusal(415, f"Unsupported content-encoding {encoding[:32]!r}: send the body as gzip, br, "
                                    "zstd or uncompressed.", "unsupported_content_encoding")
            stream.encoding = encoding
        if current is not None and not headers.end_of_stream and stream.body_mode == replies.BUFFERED and sheddable:
            keys = holders(h, current.settings.cache.tenant_header)
            why = self.admission.shed(current.settings, keys, waited)
            if why is not None:
                metrics.SHED.labels(why).inc()
                if current.settings.refuse_undecided:  # Envoy would refuse it unmarked: say when to retry
                    return shed_refusal(why)
                metrics.REQUESTS.labels(why).inc()
                return replies.headers_shed(spoofed, standard, {REASON: why}, why)
            stream.holders = keys
        if headers.end_of_stream:  # an LLM call with no body at all: Envoy sends no body message
            if current is None:  # model still loading: undecided, saying so (not Envoy's no_answer)
                metrics.REQUESTS.labels("not_ready").inc()
                return replies.headers_skip_body(spoofed, standard, "not_ready")
            metrics.BAD_REQUESTS.labels("empty").inc()
            return routed_answer.routed(None, None, current.engine.default("invalid_body"), current.settings,
                                        at_headers=True)
        stream.cache = CacheExchange.open(self.cache, stream.path, h, kept_by_envoy=h.get(CACHE_KEEPER) == "lua")
        # An answer that may be kept is shown to the router as it streams past, unless Envoy's keeper
        # hands it back whole: Envoy is asked now (the only time it takes a new mode). Envoy takes no
        # mode override in full duplex (measured: the answer never came): there an answer is kept
        # only by the keeper, or where the gateway's own config sends the router response bodies.
        watch = stream.cache is not None and not stream.cache.kept_by_envoy and not stream.duplex
        return replies.headers_continue(spoofed, watch, standard, buffer_body=stream.streamed)

    async def _on_body(self, stream: RequestStream) -> pb.ProcessingResponse:
        if self.tracing is None:
            return await self._decide(stream)
        with self.tracing.request(stream.trace_metadata) as span:
            response = await self._decide(stream)
            if stream.outcome is not None:
                span.set_attributes(decision_attributes(*stream.outcome))
            return response

    def _span(self, name: str):
        return self.tracing.span(name) if self.tracing is not None else contextlib.nullcontext()

    async def _decide(self, stream: RequestStream) -> pb.ProcessingResponse:
        started = time.perf_counter()
        current = self.serving
        if current is None:  # model still loading: let Envoy's default route take it
            metrics.REQUESTS.labels("not_ready").inc()
            return replies.body_undecided("not_ready")
        engine = current.engine
        deadline = stream.started + current.settings.deadline_s
        raw = b"".join(stream.body)
        try:
            with self._span("semantic_router.read_body"):
                read = await read_request(self._bodies, stream.path, stream.headers, raw, stream.encoding, current,
                                          deadline, cache=stream.cache is not None, facts=self.records is not None)
        except BadBody as bad:
            metrics.BAD_REQUESTS.labels(bad.kind).inc()
            log.debug("unusable request body", extra={"kind": bad.kind, "path": stream.path})
            if bad.kind in REFUSED:  # ambiguous or unreadable to backends: refused, never forwarded
                return refusal(REFUSED[bad.kind], f"Invalid request body: {bad}", bad.kind)
            read = unread(stream.path, stream.headers, raw, engine, deadline, "invalid_body")
        ctx = read.ctx
        read_at = time.perf_counter()
        with self._span("semantic_router.filter_chain"):
            failure = await current.chain.run(ctx, self.tracing.span if self.tracing is not None else None)
        if failure is not None:
            metrics.FILTER_FAILURES.labels(failure).inc()
        # A decision an earlier filter made stands, also past a failure (a pinned model must reach
        # its own backend, which the body names); only an undecided request takes the default route.
        decision = ctx.decision or engine.default(failure or "default", ctx.facts)
        if decision.route == capabilities.REFUSED:  # no model may serve what it asks
            metrics.BAD_REQUESTS.labels("no_capable_model").inc()
            return refusal(400, capabilities.refusal_message(decision), "no_capable_model")
        decided_at = time.perf_counter()
        with self._span("semantic_router.cache_lookup") if stream.cache is not None else contextlib.nullcontext():
            hit = await cached_answer(stream.cache, read, decision, current.settings)
        response = hit if hit is not None else routed_answer.routed(ctx, read.wire, decision, current.settings)
        # With tracing, a sampled request's time carries its trace id (an OpenMetrics exemplar):
        # Grafana links a slow one to its trace.
        traced = self.tracing.exemplar() if self.tracing is not None else None
        metrics.PROCESSING.observe(time.perf_counter() - started, exemplar=traced)
        cached = None if stream.cache is None else "hit" if hit else "miss" if stream.cache.key else "skipped"
        stream.outcome = (decision, ctx.requested_model, cached)
        if self.records is not None and self.records.wants():
            tenant = stream.cache.tenant if stream.cache is not None else \
                tenant_of(stream.headers, current.settings.cache.tenant_header)  # hashed once
            parts = {"read": read_at - started, "filters": decided_at - read_at, "cache": time.perf_counter() - decided_at}
            self.records.record(decision_record(ctx, decision, tenant, cached, time.perf_counter() - started, parts,
                                                traced["trace_id"] if traced else None), ctx.turns)
        if stream.cache is not None and stream.cache.key is not None:
            stream.cache.sent()
            if stream.cache.kept_by_envoy:  # the keeper's call keeps it: nothing comes through this stream
                turn = stream.cache.turn
                response = replies.naming_cache_entry(response, entry_token(*stream.cache.hand_to_keeper(), turn))
        return response
