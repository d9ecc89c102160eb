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

from esr_extproc.json_scan import BadBody

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
            out = _bounded(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True), limit)
            _zstd_whole(raw)
            return out
        if encoding == "br":
            return _bounded(_BrotliReader(raw), limit)
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


def _zstd_whole(raw: bytes) -> None:
    """Raises ZstdError unless every frame of `raw` ends: the bounded reader takes a cut stream
    for a short one (it gave half a body, which the router would have routed on). Run after that
    reader, so each frame's output is known to be within the limit."""
    rest = raw
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        frame.decompress(rest)
        if not frame.eof:
            raise zstandard.ZstdError("truncated")
        rest = frame.unused_data


class _BrotliReader:
    """brotli's streaming decompressor read like a file, at most `n` bytes of output a read, so
    _bounded stops it at the limit as it stops the others."""

    def __init__(self, raw: bytes):
        self._d, self._raw, self._at = brotli.Decompressor(), raw, 0

    def read(self, n: int) -> bytes:
        while True:
            # New input only once the last output is drained: after a limited call brotli takes
            # only empty input until it can accept more.
            chunk = b""
            if self._at < len(self._raw) and self._d.can_accept_more_data():
                chunk, self._at = self._raw[self._at:self._at + n], self._at + n
            out = self._d.process(chunk, output_buffer_limit=n)
            if out:
                return out
            if not chunk:  # nothing went in and nothing came out: the end, or a cut stream
                if not self._d.is_finished():
                    raise brotli.error("truncated")
                return b""
