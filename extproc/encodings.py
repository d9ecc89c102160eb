"""Inflates a request body sent with a content-encoding (gzip, br, zstd), never past a limit.

The router inflates it itself rather than in Envoy: behind Envoy's decompressor filter the buffered
ext_proc sends the router the inflated body without end_of_stream (Envoy 1.40, with or without a
buffer filter between them), so the router cannot tell the body is whole. The router then sends
the backend the plain body (content-encoding removed), so both read the same bytes.
"""

from __future__ import annotations

import gzip
import io
import zlib

import brotli
import zstandard

from extproc.request_body import BadBody

SUPPORTED = ("gzip", "x-gzip", "br", "zstd")
_CHUNK = 64 * 1024


def supported(encoding: str) -> bool:
    return encoding in SUPPORTED


def inflate(raw: bytes, encoding: str, limit: int) -> bytes:
    """The body `raw` encoded with `encoding`, inflated. BadBody `inflated_too_large` past `limit`
    bytes (a small body may inflate a thousandfold), `bad_encoding` when it does not decode."""
    try:
        if encoding in ("gzip", "x-gzip"):
            return _bounded(gzip.GzipFile(fileobj=io.BytesIO(raw)), limit)
        if encoding == "zstd":
            return _bounded(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True), limit)
        if encoding == "br":
            return _brotli(raw, limit)
    except (OSError, EOFError, zlib.error, zstandard.ZstdError, brotli.error) as exc:
        raise BadBody("bad_encoding", f"body does not decode as {encoding}: {type(exc).__name__}") from None
    raise BadBody("encoded", f"content-encoding {encoding!r} is not supported")


def _too_large(limit: int) -> BadBody:
    return BadBody("inflated_too_large", f"body inflates past {limit} bytes")


def _bounded(reader, limit: int) -> bytes:
    out, size = [], 0
    while piece := reader.read(_CHUNK):
        out.append(piece)
        size += len(piece)
        if size > limit:
            raise _too_large(limit)
    return b"".join(out)


def _brotli(raw: bytes, limit: int) -> bytes:
    d, out, size = brotli.Decompressor(), [], 0
    for i in range(0, max(len(raw), 1), _CHUNK):
        piece = d.process(raw[i:i + _CHUNK], output_buffer_limit=_CHUNK)
        while True:
            out.append(piece)
            size += len(piece)
            if size > limit:
                raise _too_large(limit)
            if d.can_accept_more_data():
                break
            piece = d.process(b"", output_buffer_limit=_CHUNK)
    if not d.is_finished():
        raise brotli.error("truncated")
    return b"".join(out)
