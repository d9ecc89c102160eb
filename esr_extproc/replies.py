"""Builds the ext_proc protobuf answers Envoy expects (xds-protos messages, upb-backed)."""

from __future__ import annotations

import functools
import re
from typing import Iterable, Mapping

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

from filters.context import ImmediateReply

from google.protobuf import struct_pb2

from esr_extproc.headers import (CACHE_KEEPER, CACHE_NAMESPACE, DECIDED_NAMESPACE, EPP_DESTINATION, ROUTER_HEADERS,
                                 SENT_AT)

_HEADER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_HEADER_VALUE = re.compile(r"^[\x20-\x7e]{0,256}$")
_PROTECTED = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def valid_header(name: str, value: str) -> bool:
    """Plugins may add headers; only well-formed, non-hop-by-hop ones reach Envoy."""
    return bool(_HEADER_NAME.match(name)) and name not in _PROTECTED and bool(_HEADER_VALUE.match(value))


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    out = {}
    for h in headers.headers.headers:
        out[h.key] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def _mutation(mutation: pb.HeaderMutation, set_headers: Mapping[str, str], remove: Iterable[str] = ()) -> None:
    """Fills `mutation` in place: upb builds a header there for a fraction of what nested
    constructors cost, and an answer sets five or more on every routed request
    (docs/notes/static-tier-history.md, "the front end's own cost")."""
    for k, v in set_headers.items():
        option = mutation.set_headers.add()
        option.header.key = k
        option.header.raw_value = v.encode()
        option.append_action = _OVERWRITE
    mutation.remove_headers.extend(remove)


@functools.lru_cache(maxsize=256)  # one per reason (a handful) and per undecided why
def _metadata(key: str, value: str) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update({DECIDED_NAMESPACE: {key: value}})
    return struct


def _decided(answer: pb.ProcessingResponse, reason: str) -> pb.ProcessingResponse:
    """`answer` with the router's mark (headers.DECIDED_NAMESPACE): the rendered routes send on to a
    backend only a request that carries it."""
    answer.dynamic_metadata.MergeFrom(_metadata("reason", reason))
    return answer


def _undecided(answer: pb.ProcessingResponse, why: str) -> pb.ProcessingResponse:
    """`answer` saying why the router let the request on undecided (no mark: the undecided policy)."""
    answer.dynamic_metadata.MergeFrom(_metadata("undecided", why))
    return answer


# A client's copies of the router's headers, the keeper's header (for the router only) and the
# Inference Extension's endpoint picker's (never the router's to set, nor a client's) are removed
# at the headers phase, with the standard headers the router is configured to set.
_STRIPPED = (*ROUTER_HEADERS, CACHE_KEEPER, SENT_AT, EPP_DESTINATION)


@functools.lru_cache(maxsize=16)  # built once per configuration, not per request
def _strip(spoofed: bool, also: tuple[str, ...] = ()) -> pb.HeadersResponse:
    # A route may already have been picked on the spoofed value: make Envoy pick again without it.
    return pb.HeadersResponse(response=pb.CommonResponse(
        header_mutation=pb.HeaderMutation(remove_headers=(*_STRIPPED, *also)), clear_route_cache=spoofed))


# Envoy replaces its whole processing mode with an override: every phase is named.
_PM = processing_mode_pb2.ProcessingMode
BUFFERED, STREAMED, FULL_DUPLEX = _PM.BUFFERED, _PM.STREAMED, _PM.FULL_DUPLEX_STREAMED
BUFFERED_PARTIAL = _PM.BUFFERED_PARTIAL
STREAMED_CHUNK = 64 * 1024  # a body goes back in streamed answers of at most this much
# The response's headers are not needed (what is kept must read as a whole chat completion, which
# no error or encoded body does): one message less per cacheable request.
_WATCH_RESPONSE = _PM(request_header_mode=_PM.SEND, request_body_mode=_PM.BUFFERED, request_trailer_mode=_PM.SKIP,
                      response_header_mode=_PM.SKIP, response_body_mode=_PM.STREAMED, response_trailer_mode=_PM.SKIP)


# STREAMED request bodies (Envoy Gateway's `Streamed`): Envoy sends the headers on to routing as soon
# as they are answered, so an LLM call's body is asked for whole instead, and the headers wait for it.
_BUFFER_REQUEST = _PM(request_header_mode=_PM.SEND, request_body_mode=_PM.BUFFERED, request_trailer_mode=_PM.SKIP,
                      response_header_mode=_PM.SKIP, response_body_mode=_PM.NONE, response_trailer_mode=_PM.SKIP)


def headers_continue(spoofed: bool, watch_response: bool = False, also: tuple[str, ...] = (),
                     buffer_body: bool = False) -> pb.ProcessingResponse:
    """`watch_response`: Envoy also sends the response's body as it streams through (the response
    cache keeps it); asked for at the headers phase, the only one where Envoy takes it. `also`:
    more headers to strip (the configured standard ones). `buffer_body`: the body is asked for whole
    (STREAMED mode; watching the response asks for that too)."""
    if watch_response:
        return pb.ProcessingResponse(request_headers=_strip(spoofed, also), mode_override=_WATCH_RESPONSE)
    if buffer_body:
        return pb.ProcessingResponse(request_headers=_strip(spoofed, also), mode_override=_BUFFER_REQUEST)
    return pb.ProcessingResponse(request_headers=_strip(spoofed, also))


_SKIP_BODY = _PM(request_body_mode=_PM.NONE)


def headers_skip_body(spoofed: bool, also: tuple[str, ...] = (), why: str | None = None) -> pb.ProcessingResponse:
    """Not an LLM call: strip spoofed headers and tell Envoy not to send us the body. `why`: on an LLM
    path (another method than POST), what Envoy's undecided log says of it."""
    answer = pb.ProcessingResponse(request_headers=_strip(spoofed, also), mode_override=_SKIP_BODY)
    return _undecided(answer, why) if why is not None else answer


def headers_shed(spoofed: bool, also: tuple[str, ...], headers: Mapping[str, str], why: str) -> pb.ProcessingResponse:
    """Shed at the headers phase: no body for the router, `headers` set and no route chosen, so Envoy
    takes the request by its undecided policy (envoy.undecided), saying `why`."""
    answer = pb.ProcessingResponse(mode_override=_SKIP_BODY)
    common = answer.request_headers.response
    _mutation(common.header_mutation, headers, (*_STRIPPED, *also))
    common.clear_route_cache = True
    return _undecided(answer, why)


def headers_routed(headers: Mapping[str, str], reason: str) -> pb.ProcessingResponse:
    """Decided at the headers phase (no body will come): strip client copies, set the route, mark it."""
    answer = pb.ProcessingResponse()
    common = answer.request_headers.response
    _mutation(common.header_mutation, headers, ROUTER_HEADERS)
    common.clear_route_cache = True
    return _decided(answer, reason)


def body_continue() -> pb.ProcessingResponse:
    """A body part answered as it came (not the whole body: nothing decided yet)."""
    return pb.ProcessingResponse(request_body=pb.BodyResponse())


def body_undecided(why: str) -> pb.ProcessingResponse:
    """The whole body let on unmarked: Envoy takes it by its undecided policy, and logs `why`."""
    return _undecided(pb.ProcessingResponse(request_body=pb.BodyResponse()), why)


def body_routed(headers: Mapping[str, str], new_body: bytes | None, reason: str,
                remove: tuple[str, ...] = ()) -> pb.ProcessingResponse:
    answer = pb.ProcessingResponse()
    common = answer.request_body.response
    _mutation(common.header_mutation, headers, remove)
    common.clear_route_cache = True
    if new_body is not None:
        common.body_mutation.body = new_body
    return _decided(answer, reason)


def naming_cache_entry(answer: pb.ProcessingResponse, token: str) -> pb.ProcessingResponse:
    """`answer` naming where Envoy's answer keeper hands the answer back (keeper.py), as dynamic metadata."""
    answer.dynamic_metadata.update({CACHE_NAMESPACE: {"entry": token}})
    return answer


def immediate(reply: ImmediateReply, headers: Mapping[str, str],
              details: str = "semantic_router_rejected") -> pb.ProcessingResponse:
    answer = pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=reply.status), body=reply.body, details=details))
    _mutation(answer.immediate_response.headers, {**reply.headers, **headers})
    return _decided(answer, "answered")  # by the router itself: no backend is reached


_PASS_THROUGH = {
    "response_headers": lambda: pb.ProcessingResponse(response_headers=pb.HeadersResponse()),
    "response_body": lambda: pb.ProcessingResponse(response_body=pb.BodyResponse()),
    "request_trailers": lambda: pb.ProcessingResponse(request_trailers=pb.TrailersResponse()),
    "response_trailers": lambda: pb.ProcessingResponse(response_trailers=pb.TrailersResponse()),
}


def pass_through(kind: str) -> pb.ProcessingResponse | None:
    """An empty answer for phases we asked Envoy to skip, should it send them anyway."""
    make = _PASS_THROUGH.get(kind)
    return make() if make else None


def streamed_body(body: bytes, last: bool) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse(
        body_mutation=pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(body=body, end_of_stream=last)))))


def duplex(held: pb.ProcessingResponse, answer: pb.ProcessingResponse, raw: bytes,
           ends: bool = True) -> list[pb.ProcessingResponse]:
    """A buffered-mode answer to a whole body, as full duplex takes it: the held headers answer with
    the body answer's header changes and route-cache clearing, then the body (the answer's new one,
    else as sent) in streamed chunks. An immediate answer stands as it is."""
    if not answer.HasField("request_body"):
        return [answer]
    common = answer.request_body.response
    headers = pb.ProcessingResponse()
    headers.CopyFrom(held)
    mutation = headers.request_headers.response.header_mutation
    mutation.set_headers.extend(common.header_mutation.set_headers)
    mutation.remove_headers.extend(common.header_mutation.remove_headers)
    headers.request_headers.response.clear_route_cache = True
    if answer.HasField("dynamic_metadata"):
        headers.dynamic_metadata.CopyFrom(answer.dynamic_metadata)
    body = common.body_mutation.body if common.body_mutation.WhichOneof("mutation") == "body" else raw
    chunks = [body[i:i + STREAMED_CHUNK] for i in range(0, len(body), STREAMED_CHUNK)] or [b""]
    return [headers, *(streamed_body(c, ends and i == len(chunks) - 1) for i, c in enumerate(chunks))]
