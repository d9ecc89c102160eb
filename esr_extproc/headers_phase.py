"""A request's headers phase: what the router answers to the headers Envoy sends first."""

from __future__ import annotations

import functools

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from esr_cache.cache import ResponseCache
from esr_cache.exchange import CacheExchange
from esr_extproc import encodings, metrics, replies, routed_answer
from esr_extproc.body_modes import declared_over_limit
from esr_extproc.feedback_answer import refused_at_headers
from esr_extproc.headers import CACHE_KEEPER, EPP_DESTINATION, LLM_PATHS, PINNED_NAMESPACE, REASON
from esr_extproc.routed_answer import refusal, shed_refusal
from esr_extproc.serving import Serving
from esr_extproc.shedding import Admission, holders, waited_s
from esr_extproc.stream import RequestStream, canonical_path


# Headers the body answer adds to nearly every request (the six router headers, selection's three,
# content-length) plus one spare. Not all it may add: a truncated prompt, a skipped model and a
# failover chain add three more, so a request within this of Envoy's limit can still meet it.
HEADER_HEADROOM = 11


@functools.lru_cache(maxsize=8)  # one set per configuration's standard headers
def _spoofable(standard: tuple[str, ...]) -> frozenset[str]:
    """Headers only the router (or, for the endpoint picker's, nobody on this path) may set."""
    return frozenset((*replies.ROUTER_HEADERS, *standard, EPP_DESTINATION))


def on_headers(request: pb.ProcessingRequest, stream: RequestStream, current: Serving | None, admission: Admission,
               cache: ResponseCache | None) -> pb.ProcessingResponse:
    """The answer to a request's headers: skipped (not an LLM call), refused (too many headers, a
    length over Envoy's limit, an encoding the router cannot read), shed, decided (no body), or
    continued to its body. A request is shed here only where Envoy has read the body's `model`
    itself (PINNED_NAMESPACE in its metadata), so that it still reaches a model it pins; behind a
    gateway that does not, nothing is shed here."""
    headers = request.request_headers
    sheddable = PINNED_NAMESPACE in request.metadata_context.filter_metadata
    limit_bytes = current.settings.max_inflated_bytes if current is not None else None
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
    standard = current.settings.server.gateway_headers if current is not None else ()
    spoofed = not _spoofable(standard).isdisjoint(h)
    if spoofed:
        metrics.BAD_REQUESTS.labels("spoofed_router_header").inc()
    feedback = current.engine.feedback if current is not None else None
    if feedback is not None:
        stream.feedback_path = feedback.path
        if stream.feedback_call:  # a score for selection: its body is read, never routed nor shed
            refused = refused_at_headers(stream, feedback, headers.end_of_stream)
            if refused is not None:
                return refused
            return replies.headers_continue(spoofed, False, standard, buffer_body=stream.streamed)
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
    too_large = declared_over_limit(h, limit_bytes)
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
        why = admission.shed(current.settings, keys, waited)
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
    stream.cache = CacheExchange.open(cache, stream.path, h, kept_by_envoy=h.get(CACHE_KEEPER) == "lua")
    # An answer that may be kept is shown to the router as it streams past, unless Envoy's keeper
    # hands it back whole: Envoy is asked now (the only time it takes a new mode). Envoy takes no
    # mode override in full duplex (measured: the answer never came): there an answer is kept
    # only by the keeper, or where the gateway's own config sends the router response bodies.
    watch = stream.cache is not None and not stream.cache.kept_by_envoy and not stream.duplex
    return replies.headers_continue(spoofed, watch, standard, buffer_body=stream.streamed)
