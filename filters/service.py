"""The Envoy ext_proc gRPC service: one stream per HTTP request, answered through the filter chain."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import urllib.parse
from typing import AsyncIterator, Callable

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from filters import ext_proc
from filters.body_parser import BodyParser
from filters.builtin import openai_error
from filters.chain import FilterChain
from filters.context import RequestContext
from filters.request_body import BadBody, peek_model, with_model
from router import metrics
from router.classifier import Decision
from router.engine import RoutingEngine
from router.headers import REASON, ROUTE, SCORE, SELECTED_MODEL

log = logging.getLogger(__name__)

LLM_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
# Headers the body answer may add (the four router headers, content-length) plus one spare.
HEADER_HEADROOM = 6


def canonical_path(path: str) -> str:
    """The path as the most lenient backend reads it, for deciding whether it is an LLM call.

    Envoy has already normalised it (dot segments, merged and unescaped slashes, unreserved
    escapes: `normalize_path` in the rendered config); backends may still decode other escapes,
    ignore `;params` and a trailing slash, or match case-insensitively, so the router does too.
    """
    path = urllib.parse.unquote(path.split("?", 1)[0]).split(";", 1)[0]
    return re.sub("/+", "/", path).rstrip("/").lower()


def _refuse(status: int, message: str, code: str) -> pb.ProcessingResponse:
    """An OpenAI-style error straight from the gateway; the request reaches no backend."""
    metrics.REQUESTS.labels("rejected").inc()
    return ext_proc.immediate(openai_error(status, message, code), {})


class _Stream:
    """Per-HTTP-request state between the headers and the body message."""

    __slots__ = ("started", "path", "method", "headers", "body")

    def __init__(self):
        # The request's budget runs from the first message the router sees, not from the body:
        # time spent waiting for Envoy to buffer the body or for this loop to get to it counts.
        self.started = time.monotonic()
        self.path = ""
        self.method = ""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []  # chunks; BUFFERED mode sends one, joined without a copy

    @property
    def llm_call(self) -> bool:
        return self.method == "POST" and self.path.endswith(LLM_PATHS)


class ExtProcService(pb_grpc.ExternalProcessorServicer):
    def __init__(self, current: Callable[[], tuple[RoutingEngine, FilterChain] | None]):
        # The engine and its chain come as one snapshot per request: a config reload swaps the
        # pair without touching requests in flight.
        self._current = current
        self._bodies = BodyParser()

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest], context) -> AsyncIterator[pb.ProcessingResponse]:
        stream = _Stream()
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                yield self._on_headers(request.request_headers, stream)
                if request.request_headers.end_of_stream and stream.llm_call:
                    return  # no body: answered at the headers phase
            elif kind == "request_body":
                chunk = request.request_body
                stream.body.append(chunk.body)
                if chunk.end_of_stream:
                    yield await self._on_body(stream)
                else:
                    yield ext_proc.body_continue()
            else:
                answer = ext_proc.pass_through(kind)
                if answer is not None:
                    yield answer

    def _on_headers(self, headers: pb.HttpHeaders, stream: _Stream) -> pb.ProcessingResponse:
        h = ext_proc.header_map(headers)
        stream.headers = h
        stream.method = h.get(":method", "")
        stream.path = canonical_path(h.get(":path", ""))
        spoofed = any(name in h for name in ext_proc.ROUTER_HEADERS)
        if spoofed:
            metrics.BAD_REQUESTS.labels("spoofed_router_header").inc()
        if not stream.llm_call:
            metrics.REQUESTS.labels("not_processed").inc()
            return ext_proc.headers_skip_body(spoofed)
        current = self._current()
        limit = current[0].config.envoy.max_request_headers if current else None
        if limit is not None and len(headers.headers.headers) + HEADER_HEADROOM > limit:
            # Envoy would fail the request with a 500 once the router adds its headers.
            metrics.BAD_REQUESTS.labels("too_many_headers").inc()
            return _refuse(431, f"Too many request headers: at most {limit - HEADER_HEADROOM} on this gateway.",
                           "request_header_fields_too_large")
        if headers.end_of_stream:  # an LLM call with no body at all: Envoy sends no body message
            if current is not None:
                metrics.BAD_REQUESTS.labels("empty").inc()
                return self._answer(None, current[0].default("invalid_body"), current[0], at_headers=True)
        return ext_proc.headers_continue(spoofed)

    async def _on_body(self, stream: _Stream) -> pb.ProcessingResponse:
        started = time.perf_counter()
        current = self._current()
        if current is None:  # model still loading: let Envoy's default route take it
            metrics.REQUESTS.labels("not_ready").inc()
            return ext_proc.body_continue()
        engine, chain = current
        deadline = stream.started + engine.config.server.deadline_ms / 1000.0
        raw = b"".join(stream.body)
        ctx: RequestContext | None = None
        new_body = None
        encoding = stream.headers.get("content-encoding", "identity").strip().lower()
        if len(raw) > engine.config.requests.max_body_bytes:
            metrics.BAD_REQUESTS.labels("too_large").inc()
            decision = engine.default("body_too_large")
            model, span = peek_model(raw)
            if model in engine.config.requests.model_aliases:  # "auto" must reach the backend as a model it serves
                new_body = with_model(raw, span, decision.model)
        elif encoding not in ("", "identity"):
            # A compressed body cannot be read without inflating it here; it goes on unrouted.
            metrics.BAD_REQUESTS.labels("encoded").inc()
            decision = engine.default("invalid_body")
        else:
            try:
                parsed = await self._bodies.parse(raw, stream.path, engine.config.requests)
            except BadBody as bad:
                metrics.BAD_REQUESTS.labels(bad.kind).inc()
                log.debug("unusable request body", extra={"kind": bad.kind, "path": stream.path})
                if bad.kind == "duplicate_key":  # ambiguous to backends: refused, never forwarded
                    return _refuse(400, f"Invalid request body: {bad}", "duplicate_key")
                decision = engine.default("invalid_body")
            else:
                ctx = RequestContext(
                    path=stream.path,
                    headers=stream.headers,
                    body=parsed.data,
                    requested_model=parsed.model,
                    prompt=parsed.prompt,
                    deadline=deadline,
                    engine=engine,
                    body_bytes=len(raw),
                    raw=raw,
                    model_span=parsed.model_span,
                )
                decision = await self._run_chain(ctx, engine, chain)
        response = self._answer(ctx, decision, engine, new_body)
        metrics.PROCESSING.observe(time.perf_counter() - started)
        return response

    async def _run_chain(self, ctx: RequestContext, engine: RoutingEngine, chain: FilterChain) -> Decision:
        try:
            async with asyncio.timeout_at(ctx.deadline):
                await chain.run(ctx)
        except TimeoutError:
            return engine.default("fallback_timeout")
        except Exception as exc:  # a broken filter must not fail the request, nor flood the log per request
            log.warning("filter chain failed", extra={"error": type(exc).__name__},
                        exc_info=log.isEnabledFor(logging.DEBUG))
            ctx.immediate = None
            return engine.default("fallback_error")
        return ctx.decision or engine.default("default")

    def _answer(
        self, ctx: RequestContext | None, decision: Decision, engine: RoutingEngine, new_body: bytes | None = None,
        at_headers: bool = False,
    ) -> pb.ProcessingResponse:
        if ctx is not None and ctx.immediate is not None:
            metrics.REQUESTS.labels("rejected").inc()
            return ext_proc.immediate(ctx.immediate, self._safe_extra(ctx))
        metrics.REQUESTS.labels(decision.reason).inc()
        metrics.ROUTE_DECISIONS.labels(decision.route).inc()
        headers = {
            SELECTED_MODEL: decision.model,
            ROUTE: decision.route,
            SCORE: f"{decision.score:.4f}",
            REASON: decision.reason,
        }
        if ctx is not None:
            headers = {**self._safe_extra(ctx), **headers}
            # Also on a fallback: "auto" must reach the backend as a model it serves.
            rewrite = ctx.rewrite_model and ctx.body.get("model") != decision.model
            if ctx.body_changed:
                # A filter changed the document itself: serialise it. ASCII escapes keep every
                # string valid JSON (a lone surrogate included).
                if rewrite:
                    ctx.body["model"] = decision.model
                new_body = json.dumps(dict(ctx.body), separators=(",", ":")).encode()
            elif rewrite:
                new_body = with_model(ctx.raw, ctx.model_span, decision.model)
        if new_body is not None:
            headers["content-length"] = str(len(new_body))
        if engine.config.log_prompts and ctx is not None:
            log.debug("routed", extra={"route": decision.route, "reason": decision.reason, "prompt": ctx.prompt})
        if at_headers:
            return ext_proc.headers_routed(headers)
        return ext_proc.body_routed(headers, new_body)

    @staticmethod
    def _safe_extra(ctx: RequestContext) -> dict[str, str]:
        ok = {}
        for name, value in ctx.extra_headers.items():
            if ext_proc.valid_header(name, value) and name not in ext_proc.ROUTER_HEADERS:
                ok[name] = value
            else:
                log.warning("filter header dropped", extra={"header": name[:64]})
        return ok
