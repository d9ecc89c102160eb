"""What differs by how Envoy sends a body: full duplex holds the headers answer until the body is
whole; streamed asks for an LLM call's body whole, and where the gateway refuses that, the body has
gone on before the router could route it. In every mode a body over Envoy's own request limit gets
one 413."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from esr_extproc import metrics, replies
from esr_extproc.routed_answer import refusal
from esr_extproc.stream import RequestStream

log = logging.getLogger(__name__)

Answer = Callable[[RequestStream], Awaitable[pb.ProcessingResponse]]


async def on_chunk(stream: RequestStream, chunk: pb.HttpBody, limit: int | None, on_body: Answer,
                   on_whole: Answer) -> list[pb.ProcessingResponse]:
    """The answers to one body message, by body mode: none yet (full duplex, until the end), the
    decided answer once the body is whole (`on_whole`; in full duplex `on_body`), a 413 for a part
    past what may be held, or `continue` for a part the gateway streams on. `limit`: Envoy's own
    request limit (None: not serving yet)."""
    stream.body.append(chunk.body)
    stream.body_bytes += len(chunk.body)
    if stream.duplex:
        return await duplex_chunk(stream, chunk.end_of_stream, limit, on_body)
    if chunk.end_of_stream or whole_before_trailers(stream):
        answer = over_limit(stream, limit) or await on_whole(stream)
        return [too_late_to_route(answer) if stream.unbuffered else answer]
    refused = part_past_buffer(stream, limit)
    if refused is not None:
        return [refused]
    if stream.streamed and stream.llm_call and not stream.unbuffered:
        stream.unbuffered = True  # the body was asked for whole: the override was refused
        refused_override()
    return [replies.body_continue()]


async def on_trailers(stream: RequestStream, limit: int | None, on_body: Answer) -> list[pb.ProcessingResponse]:
    """Trailers: in full duplex they end a body still held (the decided answer, then theirs);
    elsewhere they pass."""
    answers = []
    if stream.duplex and stream.held_headers is not None:
        answers = await duplex_chunk(stream, True, limit, on_body, trailers=True)
    passed = replies.pass_through("request_trailers")
    return answers + [passed] if passed is not None else answers


async def duplex_chunk(stream: RequestStream, last: bool, limit: int | None, on_body: Answer,
                       trailers: bool = False) -> list[pb.ProcessingResponse]:
    """Full duplex: chunks accumulate (nothing is answered) up to Envoy's own request limit; at
    the end the held headers answer goes back with the route, then the body, rewritten or as
    sent, in streamed body answers."""
    if stream.held_headers is None:  # not an LLM call, or already answered: the body goes on as sent
        body, stream.body = b"".join(stream.body), []
        return [replies.streamed_body(body, last)]
    if limit is not None and stream.body_bytes > limit:
        stream.held_headers, stream.body = None, []
        return [too_large(limit)]
    if not last:
        return []
    # The upload's own pace is not the router's: the deadline runs from the whole body.
    stream.started = time.monotonic()
    held, stream.held_headers = stream.held_headers, None
    # Ended by trailers: the body sent back does not end the stream, the trailers' answer does (an
    # end_of_stream before them left Envoy waiting, and the backend for the rest of the body).
    return replies.duplex(held, await on_body(stream), b"".join(stream.body), ends=not trailers)


def too_large(limit: int | None) -> pb.ProcessingResponse:
    """`limit`: None where only the gateway knows its buffer's size."""
    metrics.BAD_REQUESTS.labels("too_large_upload").inc()
    over = f"{limit} bytes" if limit is not None else "the gateway's buffer"
    return refusal(413, f"Request body over {over}.", "request_too_large")


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The body's length as its `content-length` states it; None where it states none (chunked, HTTP/2)."""
    declared = headers.get("content-length", "")
    return int(declared) if declared.isdigit() else None


def declared_over_limit(headers: Mapping[str, str], limit: int | None) -> pb.ProcessingResponse | None:
    """A 413 at the headers for a body whose content-length is over Envoy's own request limit:
    refused before it is uploaded, in every body mode. Why at the headers: in STREAMED, where
    more than Envoy's buffer arrived while the router held the headers, Envoy 1.40 stopped reading
    the upload at its buffer (its watermark) and, asked for the body whole (BUFFERED), waited for
    an end it would never read, until its request timeout (408); about 1 upload in 20 of 9 MiB on
    a loaded 2-core machine. A body of unknown length can still meet that stall: asking for it in
    BUFFERED_PARTIAL instead let the headers go on to routing before a paced upload's end (the
    route was chosen on the headers alone, measured)."""
    declared = declared_length(headers)
    if limit is None or declared is None or declared <= limit:
        return None
    return too_large(limit)


def over_limit(stream: RequestStream, limit: int | None) -> pb.ProcessingResponse | None:
    """A 413 for a streamed LLM call whose body, asked for whole, came larger than Envoy's own
    request limit: Envoy enforces envoy.max_request_bytes on bodies it buffers from the start, but
    not on one it buffers after a mode override (measured: a 12 MiB body reached the router)."""
    if not (stream.streamed and stream.llm_call and not stream.unbuffered) or limit is None \
            or stream.body_bytes <= limit:
        return None
    stream.body = []
    return too_large(limit)


def part_past_buffer(stream: RequestStream, limit: int | None) -> pb.ProcessingResponse | None:
    """A 413 for a part of an LLM call's body that came without end_of_stream in the gateway's own
    BUFFERED_PARTIAL mode: the part Envoy holds past its buffer (the rest would go on to the backend
    unread: unrouted and unguarded); in STREAMED, one past the limit (over_limit)."""
    if stream.body_mode == replies.BUFFERED_PARTIAL and stream.llm_call:
        stream.body = []
        return too_large(None)
    return over_limit(stream, limit)


def refused_override() -> None:
    metrics.BAD_REQUESTS.labels("streamed_unbuffered").inc()
    log.warning("Envoy streamed an LLM call's body on after its headers: set allow_mode_override "
                "(Envoy Gateway: processingMode.allowModeOverride) or request_body_mode BUFFERED or "
                "FULL_DUPLEX_STREAMED; until then such requests take the gateway's default route")


def too_late_to_route(answer: pb.ProcessingResponse) -> pb.ProcessingResponse:
    """The headers went on to routing and the chunks to the backend as they came: only an
    immediate answer (a refusal, a guard's block, a cached answer) still stands."""
    if answer.HasField("immediate_response"):
        return answer
    metrics.REQUESTS.labels("too_late_to_route").inc()
    return replies.body_undecided("too_late_to_route")


def whole_before_trailers(stream: RequestStream) -> bool:
    """Whether a body message without end_of_stream is the whole body all the same: trailers end the
    request (HTTP/2, or chunked HTTP/1.1), and Envoy sends a body it buffers (BUFFERED, or STREAMED
    with the override taken, where the declared length says it is all there) before them. Left
    unanswered as a part, it would go on undecided; the trailers carry nothing the router reads."""
    if not stream.llm_call:
        return False
    if stream.body_mode == replies.BUFFERED:
        return True
    return stream.streamed and not stream.unbuffered and declared_length(stream.headers) == stream.body_bytes
