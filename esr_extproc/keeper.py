"""Answers handed back whole by Envoy, for the response cache: one gRPC call per answer instead of an
ext_proc message per chunk of it.

Behind the Envoy config the router renders, a Lua filter (esr_app/envoy_config.py) says so on each
request (headers.CACHE_KEEPER); the router then does not ask to watch the answer stream past. On a
miss it names the entry in the body answer's dynamic metadata: the cache key, the semantic turn
(scope, length, vector) and when the request left. The filter copies the answer's chunks as they
pass on to the client (nothing is held back), and at its end calls Keep with the answer and that
entry. Everything the keep needs travels with it, so any router process of a pool can keep it.
Behind any other gateway the router watches the answer as before (ext_proc STREAMED response body).
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import grpc

from esr_cache.cache import ResponseCache
from esr_cache.semantic import Turn, vector_bytes, vector_from

log = logging.getLogger(__name__)

SERVICE = "semantic_router.v1.CacheKeeper"
METHOD = f"/{SERVICE}/Keep"
ENTRY = "x-semantic-cache-entry"  # the call's metadata: the entry the router named
SIZE = "x-semantic-cache-size"  # the answer's whole size: the keeper sends none past max_entry_bytes


class Entry(NamedTuple):
    key: str
    sent_at: float  # time.time() when the request went to its backend
    turn: Turn | None


def entry_token(key: str, sent_at: float, turn: Turn | None) -> str:
    if turn is None:
        return f"{key};{sent_at:.6f}"
    return f"{key};{sent_at:.6f};{turn.scope};{turn.length};{vector_bytes(turn.vector).decode()}"


def read_token(token: str) -> Entry:
    """ValueError for a token the router did not make."""
    parts = token.split(";")
    if len(parts) not in (2, 5):
        raise ValueError("not an entry token")
    turn = None
    if len(parts) == 5:
        turn = Turn(parts[2], vector_from(parts[4]), int(parts[3]))
    return Entry(parts[0], float(parts[1]), turn)


class CacheKeeper:
    def __init__(self, cache: ResponseCache):
        self.cache = cache

    def handler(self) -> grpc.GenericRpcHandler:
        # Bytes in, bytes out: the keeper frames the raw answer itself; no generated stubs needed.
        return grpc.method_handlers_generic_handler(SERVICE, {"Keep": grpc.unary_unary_rpc_method_handler(self.keep)})

    async def keep(self, answer: bytes, context: grpc.aio.ServicerContext) -> bytes:
        metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        try:
            entry = read_token(metadata.get(ENTRY, ""))
            size = int(metadata.get(SIZE, len(answer)))
        except ValueError:
            self.cache.skipped("not_understood")
            log.warning("cache keeper call without a valid entry")
            return b""
        if size > self.cache.config.max_entry_bytes:
            self.cache.skipped("too_large")
            return b""
        self.cache.keep_soon(entry.key, answer, max(0.0, time.time() - entry.sent_at), entry.turn)
        return b""
