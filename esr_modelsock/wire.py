"""The frames front ends and the model process exchange over a Unix socket.

Every frame is a little-endian u32 length (of what follows), a u8 kind, then the kind's fields.
Chosen by measurement over JSON lines and pickle (docs/scale-out.md): a fixed header and the
vector's raw float32 bytes cost one struct call and one copy each way.

  front end -> model   EMBED   u32 id, f32 budget_s, utf-8 text    (budget: seconds left before
                                                                     the caller's deadline)
                       EMBED_IDS  u32 id, f32 budget_s, u32 x n     (the text's token ids, made by
                                                                     the front end as HELLO's
                                                                     "tokens" says, in the host's byte
                                                                     order: esr_model/token_ids.py)
                       CANCEL  u32 id                               (the caller gave up: never compute)
                       CLAIM   u32 id, ascii "score key selection-id"  (a selection score this front
                                                                     end verified: take it, if no other did)
  model -> front end   HELLO   utf-8 JSON {model, dimension,        (first frame; sent once warm;
                               fingerprint, pid, tokens}             tokens: absent where the model
                                                                     takes text only)
                       VECTOR  u32 id, float32 x dimension
                       ERROR   u32 id, u8 code, utf-8 message
                       CLAIMED u32 id, u8 taken                     (1: another front end's already)
                       SCORE   ascii "score selection-id"           (a score another front end took)
"""

from __future__ import annotations

import asyncio
import logging
import struct
from batching import (BatcherClosed, BatcherError, DeadlineExceeded, ModelUnavailable, Overloaded, RemoteError,
                      WouldMissDeadline)

log = logging.getLogger(__name__)

EMBED, CANCEL, HELLO, VECTOR, ERROR, EMBED_BULK = 1, 2, 3, 4, 5, 6  # EMBED_BULK: EMBED of a bulk text (WorkItem.bulk)
# A selection score a front end accepted (router/feedback.py), passed on by the model process to the
# other front ends: a pool's workers learn from every score, wherever it was posted.
SCORE = 7
# A front end asks the model process to take a score before it accepts it, so that one request's
# score posted to two workers at once is taken once: the model process answers CLAIMED (taken or
# not), and passes a score it takes on as SCORE.
CLAIM, CLAIMED = 8, 9
# EMBED and EMBED_BULK with the text's token ids in place of the text: the model process does not
# tokenize (a front end can, where its tokenizer is the model's: HELLO's "tokens").
EMBED_IDS, EMBED_IDS_BULK = 10, 11
_CLAIMED = struct.Struct("<IBIB")  # length, kind, id, taken

_HEAD = struct.Struct("<IB")  # length, kind
_ID = struct.Struct("<I")
_EMBED = struct.Struct("<IBIf")  # length, kind, id, budget
_ID_FRAME = struct.Struct("<IBI")  # length, kind, id
_ERROR = struct.Struct("<IBIB")  # length, kind, id, code
_EMBED_FIELDS = struct.Struct("<If")
# A longer length is a broken or foreign peer: drop the connection. Text is capped before the
# model sees it (front ends send routed text of a few KiB); a vector of 16,384 floats fits.
MAX_FRAME = 1024 * 1024
MAX_TEXT = 64 * 1024
# A CLAIM's "score key id": a posted id is at most 3 KiB (router/feedback.MAX_ID), its key shorter.
MAX_SCORE = 8192

# Error codes keep the batcher's refusal kinds across the boundary: the engine's fallback reason
# depends on which it was.
_CODES: dict[type[BatcherError], int] = {
    WouldMissDeadline: 2, Overloaded: 1, DeadlineExceeded: 3, BatcherClosed: 4, ModelUnavailable: 5,
    RemoteError: 6,
}
_ERRORS = {code: cls for cls, code in _CODES.items()}
_OTHER = 0


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def embed_frame(request_id: int, budget_s: float, text: bytes, bulk: bool = False) -> bytes:
    return _EMBED.pack(9 + len(text), EMBED_BULK if bulk else EMBED, request_id, budget_s) + text


def embed_ids_frame(request_id: int, budget_s: float, ids: bytes, bulk: bool = False) -> bytes:
    return _EMBED.pack(9 + len(ids), EMBED_IDS_BULK if bulk else EMBED_IDS, request_id, budget_s) + ids


def score_frame(selection_id: str, score: float) -> bytes:
    return framed(SCORE, f"{score!r} {selection_id}".encode("ascii", "replace")[:MAX_SCORE])


def claim_frame(request_id: int, key: str, selection_id: str, score: float) -> bytes:
    text = f"{score!r} {key} {selection_id}".encode("ascii", "replace")[:MAX_SCORE]
    return _ID_FRAME.pack(5 + len(text), CLAIM, request_id) + text


def claim_of(payload: bytes) -> tuple[int, str, str, float] | None:
    """(request id, key, selection id, score) from a CLAIM payload; None for one that is not."""
    score, _, rest = payload[4:].decode("ascii", "replace").partition(" ")
    key, _, selection_id = rest.partition(" ")
    try:
        return request_id_of(payload), key, selection_id, float(score)
    except (ValueError, struct.error):
        return None


def claimed_frame(request_id: int, taken: bool) -> bytes:
    return _CLAIMED.pack(6, CLAIMED, request_id, int(taken))


def claimed_of(payload: bytes) -> tuple[int, bool]:
    """(request id, whether another front end had taken the score already) from a CLAIMED payload."""
    request_id, taken = struct.unpack_from("<IB", payload)
    return request_id, bool(taken)


def framed(kind: int, payload: bytes) -> bytes:
    return _HEAD.pack(1 + len(payload), kind) + payload


def score_of(payload: bytes) -> tuple[str, float] | None:
    """(selection id, score) from a SCORE payload; None for one that is not (the receiver verifies
    the id as it would a posted one)."""
    score, _, selection_id = payload.decode("ascii", "replace").partition(" ")
    try:
        return selection_id, float(score)
    except ValueError:
        return None


def cancel_frame(request_id: int) -> bytes:
    return _ID_FRAME.pack(5, CANCEL, request_id)


def hello_frame(info: bytes) -> bytes:
    return _HEAD.pack(1 + len(info), HELLO) + info


def vector_frame(request_id: int, vector: bytes) -> bytes:
    return _ID_FRAME.pack(5 + len(vector), VECTOR, request_id) + vector


def error_frame(request_id: int, exc: BaseException) -> bytes:
    code = next((c for cls, c in _CODES.items() if isinstance(exc, cls)), _OTHER)
    message = str(exc)[:200].encode("utf-8", "replace")
    return _ERROR.pack(6 + len(message), ERROR, request_id, code) + message


def error_of(payload: bytes) -> tuple[int, BatcherError]:
    """(request id, the exception to raise) from an ERROR payload."""
    request_id, code = _ID.unpack_from(payload)[0], payload[4]
    message = payload[5:].decode("utf-8", "replace")
    cls = _ERRORS.get(code)
    return request_id, (cls(message) if cls else BatcherError(f"model process: {message}"))


def request_id_of(payload: bytes) -> int:
    return _ID.unpack_from(payload)[0]


def split_embed(payload: bytes) -> tuple[int, float, bytes]:
    """(request id, budget in seconds, the text's UTF-8 bytes or its token ids) of an EMBED frame of any kind."""
    request_id, budget = _EMBED_FIELDS.unpack_from(payload)
    return request_id, budget, payload[8:]


class FrameReader:
    """Cuts a byte stream into (kind, payload) frames."""

    def __init__(self):
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The frames `data` completes, in order."""
        buf = self._buf
        buf += data
        frames = []
        pos, end = 0, len(buf)
        while end - pos >= 5:
            length, kind = _HEAD.unpack_from(buf, pos)
            if length < 1 or length > MAX_FRAME:
                raise ProtocolError(f"frame length {length}")
            if end - pos - 4 < length:
                break
            frames.append((kind, bytes(buf[pos + 5 : pos + 4 + length])))
            pos += 4 + length
        del buf[:pos]
        return frames


class FramedProtocol(asyncio.Protocol):
    """Either end of the socket: hands what arrives to `frames_received` cut into frames; a peer
    that breaks the protocol is dropped."""

    peer = "peer"  # who is at the other end, for the log
    transport: asyncio.Transport  # from connection_made on

    def __init__(self):
        self._reader = FrameReader()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except ProtocolError as exc:
            log.warning("dropping a peer that broke the protocol", extra={"peer": self.peer, "error": str(exc)})
            self.transport.close()
            return
        self.frames_received(frames)

    def frames_received(self, frames: list[tuple[int, bytes]]) -> None:
        raise NotImplementedError


class FrameWriter:
    """Writes the frames of one event-loop iteration with one system call: a batch settles all its
    requests in one iteration, and requests that resume together are sent together."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, frame: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(frame)

    def _flush(self) -> None:
        frames, self._pending = self._pending, []
        if not self._transport.is_closing():
            self._transport.write(b"".join(frames))
