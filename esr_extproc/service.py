"""The Envoy ext_proc gRPC service: one stream per HTTP request, answered through the filter chain."""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import AsyncIterator, NamedTuple

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from esr_extproc import encodings, replies
from esr_extproc.body_parser import BodyParser, ParserUnavailable, ParseTimeout
from filters.builtin import openai_error
from filters.chain import FilterChain
from filters.context import ImmediateReply, RequestContext
from router.config import RequestsConfig
from esr_cache.cache import ResponseCache, opted_out
from esr_cache.semantic import Turn, turn_length
from esr_extproc.json_scan import AMBIGUOUS, BadBody, member_bytes, member_digest, with_members
from esr_extproc.request_body import CacheView
from esr_extproc import metrics
from esr_extproc.config import ServerConfig
from router.classifier import Decision
from router.engine import RoutingEngine, RoutingUnavailable
from esr_extproc.keeper import entry_token
from esr_extproc.headers import (CACHE_KEEPER, CONFIDENCE, EPP_DESTINATION, LLM_PATHS, PINNED_NAMESPACE, REASON, ROUTE,
                                 SCORE, SELECTED_MODEL, SENT_AT, TIER, TRUNCATED)

log = logging.getLogger(__name__)

# The requests whose answers the response cache keeps (the chat completions API).
CACHED_PATH = "/v1/chat/completions"

# Headers the body answer may add (the six router headers, content-length) plus one spare.
HEADER_HEADROOM = 8


def canonical_path(path: str) -> str:
    """The path as the most lenient backend reads it, for deciding whether it is an LLM call.

    Envoy has already normalised it (dot segments, merged and unescaped slashes, unreserved
    escapes: `normalize_path` in the rendered config); backends may still decode other escapes,
    ignore `;params` and a trailing slash, or match case-insensitively, so the router does too.
    """
    path = urllib.parse.unquote(path.split("?", 1)[0]).split(";", 1)[0]
    return re.sub("/+", "/", path).rstrip("/").lower()


# Bodies refused outright, with their status, rather than routed to the default: backends would
# read them differently from the router (json_scan.AMBIGUOUS) or not at all. Any other unusable
# body goes through the chain unread: a guard decides it by its on_error, else the default route.
REFUSED = {**dict.fromkeys(AMBIGUOUS, 400), "bad_encoding": 400, "inflated_too_large": 413}


def _refuse(status: int, message: str, code: str) -> pb.ProcessingResponse:
    """An OpenAI-style error straight from the gateway; the request reaches no backend."""
    metrics.REQUESTS.labels("rejected").inc()
    return replies.immediate(openai_error(status, message, code), {})


def _waited_s(headers: dict[str, str]) -> float:
    """How long the request waited between Envoy sending it on and the router reading it (the
    rendered config's stamp, headers.SENT_AT; one host's clock, the sidecar's); 0 where unknown."""
    try:
        return max(0.0, time.time() - int(headers[SENT_AT]) / 1e6)
    except (KeyError, ValueError):
        return 0.0


class _Stream:
    """Per-HTTP-request state between the headers and the body message."""

    __slots__ = ("started", "path", "method", "headers", "body", "encoding", "cache_tenant", "cache_key", "answer",
                 "answer_bytes", "sent_at", "cache_turn", "cache_view", "kept_by_envoy", "body_mode", "held_headers",
                 "body_bytes", "unbuffered", "admitted")

    def __init__(self) -> None:
        # The request's budget runs from the first message the router sees, not from the body:
        # time spent waiting for Envoy to buffer the body or for this loop to get to it counts.
        self.started = time.monotonic()
        self.path = ""
        self.method = ""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []  # chunks; BUFFERED mode sends one, joined without a copy
        self.encoding: str | None = None  # the body's content-encoding, one encodings.inflate reads
        # The response cache: the tenant of a cacheable request (None: not cacheable), the key its
        # answer is kept under once it comes back (None: not to be kept), the answer's chunks.
        self.cache_tenant: str | None = None
        self.cache_key: str | None = None
        self.answer: list[bytes] = []
        self.answer_bytes = 0
        self.sent_at = 0.0
        self.cache_turn: Turn | None = None  # semantic matching: the last user turn, embedded
        self.cache_view: CacheView | None = None  # what the parser made for the key (cacheable requests)
        self.kept_by_envoy = False  # Envoy's keeper hands the answer back whole (keeper.py)
        self.body_mode = replies.BUFFERED  # as Envoy's first message says (protocol_config)
        self.admitted = False  # counted in the service's in_flight until its body is answered
        self.held_headers: pb.ProcessingResponse | None = None  # full duplex: the answer the body completes
        self.body_bytes = 0
        self.unbuffered = False  # streamed: the body came on in chunks, the override refused

    @property
    def duplex(self) -> bool:
        """FULL_DUPLEX_STREAMED: the headers answer is held until the body is whole, then sent with
        the route before the body."""
        return self.body_mode == replies.FULL_DUPLEX

    @property
    def streamed(self) -> bool:
        """STREAMED: an LLM call's body is asked for whole (mode_override); a gateway that refuses
        overrides streams it on anyway, too late to route."""
        return self.body_mode == replies.STREAMED

    @property
    def llm_call(self) -> bool:
        return self.method == "POST" and self.path.endswith(LLM_PATHS)


@dataclass(frozen=True)
class ServiceSettings:
    """What the service reads of the config, swapped with the engine on reload."""

    deadline_s: float  # a request still undecided this long after its first message gets the default route
    requests: RequestsConfig
    max_request_headers: int  # Envoy's limit (envoy.max_request_headers)
    max_inflated_bytes: int  # an encoded body may inflate to Envoy's own buffer (envoy.max_request_bytes)
    log_prompts: bool = False
    server: ServerConfig = field(default_factory=ServerConfig)  # the standard headers it sets


class Serving(NamedTuple):
    """The engine, its filter chain and the settings they were built with: read as one snapshot
    per request, so a reload never mixes two configs in one answer."""

    engine: RoutingEngine
    chain: FilterChain
    settings: ServiceSettings


class ExtProcService(pb_grpc.ExternalProcessorServicer):
    def __init__(self, process: str = "router", cache: ResponseCache | None = None):
        self._streams = metrics.STREAMS.labels(process)
        self.cache = cache  # None: no response cache
        # Swapped whole by a config reload (serve) without touching requests in flight. None until
        # the first engine is built.
        self.serving: Serving | None = None
        self._bodies = BodyParser()
        self.in_flight = 0  # LLM calls admitted at their headers whose answer is not yet sent (server.max_in_flight)

    def start(self) -> None:
        """Starts what serving needs beside the engine: the worker process for large bodies."""
        self._bodies.start()

    def serve(self, serving: Serving) -> None:
        self.serving = serving

    @property
    def engine(self) -> RoutingEngine | None:
        return self.serving.engine if self.serving is not None else None

    def close(self) -> None:
        self._bodies.close()

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest], context) -> AsyncIterator[pb.ProcessingResponse]:
        stream = _Stream()
        self._streams.inc()
        try:
            async for answer in self._process(request_iterator, stream):
                yield answer
        finally:
            self._release(stream)

    def _release(self, stream: "_Stream") -> None:
        if stream.admitted:
            stream.admitted = False
            self.in_flight -= 1

    async def _process(self, request_iterator: AsyncIterator[pb.ProcessingRequest], stream: "_Stream"
                       ) -> AsyncIterator[pb.ProcessingResponse]:
        async for request in request_iterator:
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
                yield answer
                if request.request_headers.end_of_stream and stream.llm_call:
                    return  # no body: answered at the headers phase
            elif kind == "request_body":
                if not stream.method:  # Envoy sent no headers message (request_header_mode: SKIP)
                    self._from_attributes(request, stream)
                chunk = request.request_body
                stream.body.append(chunk.body)
                stream.body_bytes += len(chunk.body)
                if stream.duplex:
                    for answer in await self._on_duplex_chunk(stream, chunk.end_of_stream):
                        yield answer
                elif chunk.end_of_stream:
                    answer = await self._on_body(stream)
                    self._release(stream)  # answered: what the stream waits for now is the backend's
                    yield self._too_late_to_route(answer) if stream.unbuffered else answer
                else:
                    if stream.streamed and stream.llm_call and not stream.unbuffered:
                        stream.unbuffered = True  # the body was asked for whole: the override was refused
                        self._refused_override()
                    yield replies.body_continue()
            elif kind == "request_trailers" and stream.duplex and stream.held_headers is not None:
                for answer in await self._on_duplex_chunk(stream, True):  # trailers end the body
                    yield answer
                yield replies.pass_through(kind)
            elif kind == "response_body" and stream.cache_key is not None:
                yield self._on_response_body(request.response_body, stream)
            else:
                answer = replies.pass_through(kind)
                if answer is not None:
                    yield answer

    async def _on_duplex_chunk(self, stream: _Stream, last: bool) -> list[pb.ProcessingResponse]:
        """Full duplex: chunks accumulate (nothing is answered) up to Envoy's own request limit; at
        the end the held headers answer goes back with the route, then the body, rewritten or as
        sent, in streamed body answers."""
        if stream.held_headers is None:  # not an LLM call, or already answered: the body goes on as sent
            body, stream.body = b"".join(stream.body), []
            return [replies.streamed_body(body, last)]
        current = self.serving
        limit = current.settings.max_inflated_bytes if current is not None else None
        if limit is not None and stream.body_bytes > limit:
            stream.held_headers, stream.body = None, []
            metrics.BAD_REQUESTS.labels("too_large_upload").inc()
            return [_refuse(413, f"Request body over {limit} bytes.", "request_too_large")]
        if not last:
            return []
        # The upload's own pace is not the router's: the deadline runs from the whole body.
        stream.started = time.monotonic()
        held, stream.held_headers = stream.held_headers, None
        return replies.duplex(held, await self._on_body(stream), b"".join(stream.body))

    @staticmethod
    def _refused_override() -> None:
        metrics.BAD_REQUESTS.labels("streamed_unbuffered").inc()
        log.warning("Envoy streamed an LLM call's body on after its headers: set allow_mode_override "
                    "(Envoy Gateway: processingMode.allowModeOverride) or request_body_mode BUFFERED or "
                    "FULL_DUPLEX_STREAMED; until then such requests take the gateway's default route")

    @staticmethod
    def _too_late_to_route(answer: pb.ProcessingResponse) -> pb.ProcessingResponse:
        """The headers went on to routing and the chunks to the backend as they came: only an
        immediate answer (a refusal, a guard's block, a cached answer) still stands."""
        if answer.HasField("immediate_response"):
            return answer
        metrics.REQUESTS.labels("too_late_to_route").inc()
        return replies.body_continue()

    @staticmethod
    def _from_attributes(request: pb.ProcessingRequest, stream: _Stream) -> None:
        """Path and method from the attributes Envoy attaches to the first message it sends
        (`request_attributes: [request.path, request.method]`)."""
        attrs = request.attributes.get("envoy.filters.http.ext_proc")
        if attrs is not None:
            stream.method = attrs.fields["request.method"].string_value if "request.method" in attrs.fields else ""
            if "request.path" in attrs.fields:
                stream.path = canonical_path(attrs.fields["request.path"].string_value)

    def _on_headers(self, headers: pb.HttpHeaders, stream: _Stream, sheddable: bool = False) -> pb.ProcessingResponse:
        """`sheddable`: Envoy has read the body's `model` itself (PINNED_NAMESPACE), so a request shed
        here still reaches a model it pins; behind a gateway that does not, nothing is shed here."""
        h = replies.header_map(headers)
        stream.headers = h
        stream.method = h.get(":method", "")
        stream.path = canonical_path(h.get(":path", ""))
        current = self.serving
        standard = current.settings.server.gateway_headers if current is not None else ()
        spoofed = any(name in h for name in (*replies.ROUTER_HEADERS, *standard, EPP_DESTINATION))
        if spoofed:
            metrics.BAD_REQUESTS.labels("spoofed_router_header").inc()
        if not stream.llm_call:
            metrics.REQUESTS.labels("not_processed").inc()
            return replies.headers_skip_body(spoofed, standard)
        limit = current.settings.max_request_headers if current else None
        if limit is not None and len(headers.headers.headers) + HEADER_HEADROOM > limit:
            # Envoy would fail the request with a 500 once the router adds its headers.
            metrics.BAD_REQUESTS.labels("too_many_headers").inc()
            return _refuse(431, f"Too many request headers: at most {limit - HEADER_HEADROOM} on this gateway.",
                           "request_header_fields_too_large")
        encoding = h.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            if not encodings.supported(encoding):
                # Not readable here, and a backend that inflates it would get it unexamined.
                metrics.BAD_REQUESTS.labels("encoded").inc()
                return _refuse(415, f"Unsupported content-encoding {encoding[:32]!r}: send the body as gzip, br, "
                                    "zstd or uncompressed.", "unsupported_content_encoding")
            stream.encoding = encoding
        if current is not None and not headers.end_of_stream and stream.body_mode == replies.BUFFERED and sheddable:
            server = current.settings.server
            if (server.max_in_flight and self.in_flight >= server.max_in_flight) \
                    or (server.shed_wait_s and _waited_s(h) > server.shed_wait_s):
                metrics.REQUESTS.labels("fallback_overload").inc()
                metrics.SHED.inc()
                return replies.headers_shed(spoofed, standard, {REASON: "fallback_overload"})
            stream.admitted = True
            self.in_flight += 1
        if headers.end_of_stream:  # an LLM call with no body at all: Envoy sends no body message
            if current is not None:
                metrics.BAD_REQUESTS.labels("empty").inc()
                return self._answer(None, current.engine.default("invalid_body"), current, at_headers=True)
        if self.cache is not None and stream.path == CACHED_PATH:
            if opted_out(h):
                self.cache.skipped("no_store")
            else:
                stream.cache_tenant = self.cache.tenant(h)
                # Its answer may be kept: Envoy's keeper hands it back whole, or else Envoy is asked
                # now (the only time it takes a new mode) to show it to the router as it streams past.
                # Envoy takes no mode override in full duplex (measured: the answer never came):
                # there an answer is kept only by the keeper, or where the gateway's own config
                # sends the router response bodies.
                stream.kept_by_envoy = h.get(CACHE_KEEPER) == "lua"
                return replies.headers_continue(spoofed, not stream.kept_by_envoy and not stream.duplex, standard,
                                               buffer_body=stream.streamed)
        return replies.headers_continue(spoofed, also=standard, buffer_body=stream.streamed)

    async def _on_body(self, stream: _Stream) -> pb.ProcessingResponse:
        started = time.perf_counter()
        current = self.serving
        if current is None:  # model still loading: let Envoy's default route take it
            metrics.REQUESTS.labels("not_ready").inc()
            return replies.body_continue()
        engine = current.engine
        deadline = stream.started + current.settings.deadline_s
        raw = b"".join(stream.body)
        try:
            ctx = await self._context(stream, raw, current, deadline)
        except BadBody as bad:
            metrics.BAD_REQUESTS.labels(bad.kind).inc()
            log.debug("unusable request body", extra={"kind": bad.kind, "path": stream.path})
            if bad.kind in REFUSED:  # ambiguous or unreadable to backends: refused, never forwarded
                return _refuse(REFUSED[bad.kind], f"Invalid request body: {bad}", bad.kind)
            ctx = self._unread(stream, raw, engine, deadline, "invalid_body")
        decision = await self._run_chain(ctx, engine, current.chain)
        hit = await self._from_cache(ctx, decision, stream)
        response = hit if hit is not None else self._answer(ctx, decision, current)
        metrics.PROCESSING.observe(time.perf_counter() - started)
        if stream.cache_key is not None:
            stream.sent_at = time.monotonic()  # what the backend takes from here is what a hit saves
            if stream.kept_by_envoy:
                response = replies.naming_cache_entry(response, entry_token(stream.cache_key, time.time(), stream.cache_turn))
                stream.cache_key = None  # the keeper's call keeps it: nothing comes through this stream
        return response

    async def _from_cache(self, ctx: RequestContext, decision: Decision, stream: _Stream
                          ) -> pb.ProcessingResponse | None:
        """A cached answer to this request, or None; on a miss the stream remembers where its answer
        goes. A failure here costs the request its cache, never its routing: the stream goes on."""
        cache = self.cache
        if cache is None or stream.cache_tenant is None or ctx.immediate is not None:
            return None
        view = stream.cache_view
        if ctx.unread is not None or view is None or view.history is None:
            cache.skipped("unread_body")
            return None
        if ctx.body_changed:  # a filter rewrote the document: its bytes are not the ones keyed
            cache.skipped("changed_body")
            return None
        try:
            hit = await self._lookup(cache, ctx, decision, stream, view)
        except Exception as exc:
            log.warning("response cache lookup failed", extra={"error": type(exc).__name__})
            cache.skipped("error")
            stream.cache_key = None
            return None
        if hit is None:
            return None
        body, headers = hit
        metrics.REQUESTS.labels("cache_hit").inc()
        route = {ROUTE: decision.route, SELECTED_MODEL: decision.model, REASON: decision.reason}
        return replies.immediate(ImmediateReply(200, body, headers), route, details="semantic_cache_hit")

    async def _lookup(self, cache: ResponseCache, ctx: RequestContext, decision: Decision, stream: _Stream,
                      view: CacheView) -> tuple[bytes, dict[str, str]] | None:
        # Keyed on the body as forwarded: the route's set_body members are what the backend reads.
        members = dict(view.members)
        for name, value in _set_body(ctx, decision).items():
            members[name] = member_digest(member_bytes(value))
        assert stream.cache_tenant is not None and view.history is not None
        key = cache.key(stream.cache_tenant, decision.model, members)
        scope = cache.scope(stream.cache_tenant, decision.model, decision.route, members, view.history)
        if scope is not None and view.last_turn is not None:
            # Routing has usually embedded this turn already: the engine's cache answers.
            try:
                vector = await ctx.engine.embed(view.last_turn, ctx.deadline)
                stream.cache_turn = Turn(scope, vector, turn_length(view.last_turn))
            except RoutingUnavailable:
                pass  # exact matching only, this once
        hit = await cache.lookup(key, view.stream, stream.cache_turn, cache.config.threshold_of(decision.route))
        if hit is None:
            stream.cache_key = key
        return hit

    def _on_response_body(self, chunk: pb.HttpBody, stream: _Stream) -> pb.ProcessingResponse:
        cache = self.cache
        assert cache is not None and stream.cache_key is not None
        stream.answer_bytes += len(chunk.body)
        if stream.answer_bytes > cache.config.max_entry_bytes:
            cache.skipped("too_large")
            stream.cache_key, stream.answer = None, []
        else:
            stream.answer.append(chunk.body)
            if chunk.end_of_stream:
                cache.keep_soon(stream.cache_key, b"".join(stream.answer), time.monotonic() - stream.sent_at,
                                stream.cache_turn)
                stream.cache_key, stream.answer = None, []
        return pb.ProcessingResponse(response_body=pb.BodyResponse())

    async def _context(self, stream: _Stream, raw: bytes, serving: Serving, deadline: float) -> RequestContext:
        """What the filters see. A body above requests.max_body_bytes is not read (only its model is
        peeked at), but it still goes through the chain: size limits, model policy, pinning."""
        engine, chain = serving.engine, serving.chain
        ctx = self._unread(stream, raw, engine, deadline, None)
        try:
            if stream.encoding is not None:
                raw = await self._bodies.inflate(raw, stream.encoding, serving.settings.max_inflated_bytes, deadline)
                ctx.raw, ctx.body_bytes, ctx.inflated = raw, len(raw), True
            if len(raw) > serving.settings.requests.max_body_bytes:
                metrics.BAD_REQUESTS.labels("too_large").inc()
                ctx.unread = "body_too_large"
                ctx.requested_model, ctx.model_span = await self._bodies.scan_unread(raw, deadline)
                return ctx
            parsed = await self._bodies.parse(raw, stream.path, serving.settings.requests,
                                              engine.config.conversation.turns_read, deadline, chain.reads_all_text,
                                              engine.rules.reads_facts, cache=stream.cache_tenant is not None)
        except ParseTimeout:
            # Not read by the deadline (a costly shape, a busy parser): the chain still runs on
            # what is known, so a filter that must examine every body can refuse it.
            metrics.BAD_REQUESTS.labels("parse_timeout").inc()
            ctx.unread = ctx.unread or "fallback_timeout"
            return ctx
        except ParserUnavailable:
            metrics.BAD_REQUESTS.labels("parser_failed").inc()
            ctx.unread = ctx.unread or "fallback_error"
            return ctx
        stream.cache_view = parsed.cache
        ctx.body, ctx.requested_model, ctx.model_span = parsed.data, parsed.model, parsed.model_span
        ctx.turns, ctx.guard_pieces, ctx.truncated = parsed.turns, parsed.guard, parsed.truncated
        if parsed.facts is not None:
            ctx.facts = parsed.facts
        return ctx

    @staticmethod
    def _unread(stream: _Stream, raw: bytes, engine: RoutingEngine, deadline: float, why: str | None) -> RequestContext:
        """A context with nothing read from the body yet (`why`: why nothing will be)."""
        return RequestContext(path=stream.path, headers=stream.headers, body={}, requested_model=None,
                              deadline=deadline, engine=engine, body_bytes=len(raw), raw=raw, unread=why)

    async def _run_chain(self, ctx: RequestContext, engine: RoutingEngine, chain: FilterChain) -> Decision:
        failure = await chain.run(ctx)
        if failure is None:
            return ctx.decision or engine.default("default")
        metrics.FILTER_FAILURES.labels(failure).inc()
        # A decision an earlier filter made stands (a pinned model must reach its own backend, which
        # the body names); only an undecided request takes the default route.
        return ctx.decision or engine.default(failure)

    def _answer(
        self, ctx: RequestContext | None, decision: Decision, serving: Serving, at_headers: bool = False,
    ) -> pb.ProcessingResponse:
        if ctx is not None and ctx.immediate is not None:
            metrics.REQUESTS.labels("rejected").inc()
            return replies.immediate(ctx.immediate, self._safe_extra(ctx))
        metrics.REQUESTS.labels(decision.reason).inc()
        metrics.ROUTE_DECISIONS.labels(decision.route).inc()
        headers = {
            SELECTED_MODEL: decision.model,
            ROUTE: decision.route,
            SCORE: f"{decision.score:.4f}",
            REASON: decision.reason,
            CONFIDENCE: f"{decision.confidence:.4f}",
            **serving.settings.server.standard_headers(decision.model),
        }
        if decision.tier:
            headers[TIER] = decision.tier
        new_body = None
        if ctx is not None:
            headers = {**self._safe_extra(ctx), **headers}
            if ctx.truncated:
                metrics.PROMPT_TRUNCATED.inc()
                headers[TRUNCATED] = serving.settings.requests.truncate  # which part was routed on
            # Also on a fallback: "auto" must reach the backend as a model it serves.
            set_body = _set_body(ctx, decision)
            if ctx.body_changed and ctx.unread is None:
                # A filter changed the document itself: serialise it. ASCII escapes keep every
                # string valid JSON (a lone surrogate included).
                if ctx.rewrite_model:
                    ctx.body["model"] = decision.model
                ctx.body.update(set_body)
                new_body = json.dumps(dict(ctx.body), separators=(",", ":")).encode()
            else:
                if ctx.body_changed:
                    log.warning("filter changed an unread body; change dropped", extra={"kind": ctx.unread})
                members = {k: (_byte_span(ctx.body, k), v) for k, v in set_body.items()}
                # An unread body is rewritten only where its model was found: a second `model`
                # key would be ambiguous to backends.
                if ctx.rewrite_model and ctx.requested_model != decision.model and (
                        ctx.unread is None or ctx.model_span is not None):
                    members["model"] = (ctx.model_span, decision.model)
                if members:
                    new_body = with_members(ctx.raw, members)
            if ctx.inflated and new_body is None:
                new_body = ctx.raw  # the backend reads the bytes the router read
        if new_body is not None:
            headers["content-length"] = str(len(new_body))
        plain = ctx is not None and ctx.inflated
        if serving.settings.log_prompts and ctx is not None:
            log.debug("routed", extra={"route": decision.route, "reason": decision.reason, "prompt": ctx.prompt})
        if at_headers:
            return replies.headers_routed(headers)
        return replies.body_routed(headers, new_body, remove=("content-encoding",) if plain else ())

    @staticmethod
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


def _set_body(ctx: RequestContext, decision: Decision) -> dict:
    """The members the route's `set_body` writes: only where the router chose the route (not to a
    pinned model) and read the body."""
    return ctx.engine.set_body_of(decision.route) if ctx.rewrite_model and ctx.unread is None else {}


def _byte_span(body, key: str) -> tuple[int, int] | None:
    """Where a top-level member of the parsed body sits in its raw bytes (None: not there)."""
    span_of = getattr(body, "byte_span", None)
    return span_of(key) if span_of is not None else None
