"""Puts an Embedder (the model process's batcher) on a Unix socket for any number of front ends."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import math
import os
import socket
import struct
import time
from pathlib import Path

import numpy as np

from batching import ContinuousBatcher, Overloaded
from batching.queue import WorkItem
from esr_modelsock import wire

log = logging.getLogger(__name__)


class SocketInUse(RuntimeError):
    """Another model process answers on this socket path."""


MAX_IN_FLIGHT = 4096  # requests one front end may have open; past it each is refused (overload)
# Scores kept for a front end that connects later: with selection feedback's default half-life (200
# scores) and prior (20), the last 2,000 make a worker's corrections within 0.1% of the others'.
SCORES_KEPT = 2000
# Scores taken, remembered (as digests) to refuse a second front end the same request's score: as
# many as a front end remembers itself (router/feedback.py SEEN), which refuses older ids as expired.
TAKEN_KEPT = 65_536


class Scores:
    """The selection scores the pool's front ends took: which requests' (each once), and the last
    SCORES_KEPT, for a front end that connects later."""

    def __init__(self):
        self.kept: collections.deque[bytes] = collections.deque(maxlen=SCORES_KEPT)  # SCORE frames
        self._taken: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def take(self, key: str) -> bool:
        """Whether `key` (a request's signed selection id) is taken now; False: it was already."""
        digest = hashlib.blake2b(key.encode("ascii", "replace"), digest_size=16).digest()
        if digest in self._taken:
            return False
        self._taken[digest] = None
        if len(self._taken) > TAKEN_KEPT:
            self._taken.popitem(last=False)
        return True


_EMBEDS = frozenset((wire.EMBED, wire.EMBED_BULK, wire.EMBED_IDS, wire.EMBED_IDS_BULK))
_BULK = frozenset((wire.EMBED_BULK, wire.EMBED_IDS_BULK))
_IDS = frozenset((wire.EMBED_IDS, wire.EMBED_IDS_BULK))

_PEERCRED = struct.Struct("3i")  # pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    return _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[1]


class _Reply:
    """One request's answer: written to the front end the moment its batch settles, or not at all
    once the request is cancelled (by the front end, or by the connection going away)."""

    __slots__ = ("connection", "request_id", "item")

    def __init__(self, connection: "_Connection", request_id: int):
        self.connection, self.request_id = connection, request_id
        self.item: WorkItem | None = None

    def done(self) -> bool:
        return self.connection.replies.get(self.request_id) is not self

    def set_result(self, vector) -> None:
        # float32 whatever the backend computed in: the wire and the front ends read float32
        self.connection.answer(self, wire.vector_frame(self.request_id, vector.astype(np.float32, copy=False).tobytes()))

    def set_exception(self, exc: BaseException) -> None:
        self.connection.answer(self, wire.error_frame(self.request_id, exc))


class _Connection(wire.FramedProtocol):
    """One front end. Its requests go to the batcher without a task, timer or future each (the
    front end keeps the deadline and says CANCEL when it gives up; the batcher drops a request
    whose deadline passed when it cuts a batch); a cancelled request, or every request of a front
    end that went away, leaves the queue without being computed. Only a process of this process's
    user may connect (SO_PEERCRED); every frame is checked before it costs anything (a finite,
    non-negative budget; text within wire.MAX_TEXT; MAX_IN_FLIGHT open)."""

    peer = "front end"

    def __init__(self, batcher: ContinuousBatcher, hello: bytes, connections: set, scores: Scores):
        super().__init__()
        self._batcher = batcher
        self._connections = connections
        self._scores = scores
        self._hello = hello
        self.replies: dict[int, _Reply] = {}
        self._out: wire.FrameWriter  # from connection_made on

    @property
    def in_flight(self) -> int:
        return len(self.replies)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        uid = peer_uid(transport.get_extra_info("socket"))
        if uid != os.getuid():
            log.warning("refused a front end of another user", extra={"peer_uid": uid})
            transport.close()
            return
        self._connections.add(self)
        self._out = wire.FrameWriter(transport, asyncio.get_running_loop())
        self._out.write(wire.hello_frame(self._hello))
        for frame in self._scores.kept:  # a worker started (or restarted) now learns what the others have
            self._out.write(frame)

    def frames_received(self, frames: list[tuple[int, bytes]]) -> None:
        now = time.monotonic()
        arrived: list[tuple[str | bytes, float, _Reply]] = []  # admitted together: one queue decision for a read
        bulk: list[tuple[str | bytes, float, _Reply]] = []  # and the bulk texts of the read, in another
        for kind, payload in frames:
            if kind in _EMBEDS:
                request_id, budget, raw = wire.split_embed(payload)
                refused = self._refusal(request_id, budget, raw)
                if refused is not None:
                    self._out.write(wire.error_frame(request_id, refused))
                    continue
                reply = self.replies[request_id] = _Reply(self, request_id)
                # token ids go to the batcher as bytes, read on its tokenizer thread (submit_many)
                (bulk if kind in _BULK else arrived).append(
                    (raw if kind in _IDS else raw.decode("utf-8", "surrogatepass"), now + budget, reply))
            elif kind == wire.CLAIM:
                self._claim(payload)
            elif kind == wire.CANCEL:
                self._submit(arrived)  # a CANCEL may name a request of this same read
                self._submit(bulk, True)
                arrived, bulk = [], []
                self._drop(self.replies.pop(wire.request_id_of(payload), None))
        self._submit(arrived)
        self._submit(bulk, True)

    def _claim(self, payload: bytes) -> None:
        """A score this front end verified: taken if no front end took that request's before, and
        then passed on to every other front end now, and to those that connect later (the last
        SCORES_KEPT)."""
        claim = wire.claim_of(payload)
        if claim is None:
            return  # not of this protocol's front ends: it waits out its own timeout, then decides alone
        request_id, key, selection_id, score = claim
        first = self._scores.take(key)
        self._out.write(wire.claimed_frame(request_id, taken=not first))
        if not first:
            return
        frame = wire.score_frame(selection_id, score)
        self._scores.kept.append(frame)
        for other in self._connections:
            if other is not self:
                other._out.write(frame)

    def _submit(self, arrived: list[tuple[str | bytes, float, _Reply]], bulk: bool = False) -> None:
        if not arrived:
            return
        for (_, _, reply), outcome in zip(arrived, self._batcher.submit_many(arrived, bulk)):
            if isinstance(outcome, WorkItem):
                reply.item = outcome
            else:
                reply.set_exception(outcome)

    def _refusal(self, request_id: int, budget: float, raw: bytes) -> Exception | None:
        if not math.isfinite(budget) or budget < 0:
            return ValueError(f"budget {budget!r} is not a finite, non-negative time")
        if len(raw) > wire.MAX_TEXT:
            return ValueError(f"text of {len(raw)} bytes; at most {wire.MAX_TEXT}")
        if request_id in self.replies:
            return ValueError(f"request id {request_id} is already in flight")
        if len(self.replies) >= MAX_IN_FLIGHT:
            return Overloaded(f"{MAX_IN_FLIGHT} requests in flight on this connection")
        return None

    def answer(self, reply: _Reply, frame: bytes) -> None:
        if self.replies.get(reply.request_id) is reply:
            del self.replies[reply.request_id]
            self._out.write(frame)

    @staticmethod
    def _drop(reply: _Reply | None) -> None:
        if reply is not None and reply.item is not None:
            reply.item.cancelled = True

    def close(self) -> None:
        self.transport.close()

    def connection_lost(self, exc) -> None:
        self._connections.discard(self)
        for reply in self.replies.values():
            self._drop(reply)
        self.replies.clear()


class ModelSocketServer:
    def __init__(self, batcher: ContinuousBatcher, path: str | Path, info: dict):
        self.batcher = batcher
        self.path = Path(path)
        self._hello = json.dumps({**info, "pid": os.getpid()}).encode()
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()
        self._scores = Scores()

    @property
    def in_flight(self) -> int:
        """Requests being answered, over every front end."""
        return sum(c.in_flight for c in self._connections)

    async def start(self) -> None:
        """Listens once the embedder is warm: a front end that connects can be answered at once."""
        claim(self.path)
        loop = asyncio.get_running_loop()
        # Mode 0600 from the moment it exists (not after a chmod): only this user's processes
        # (the routers run as the same uid) can connect; the peer check below says so again.
        umask = os.umask(0o177)
        try:
            self._server = await loop.create_unix_server(
                lambda: _Connection(self.batcher, self._hello, self._connections, self._scores), str(self.path))
        finally:
            os.umask(umask)
        log.info("model socket listening", extra={"socket": str(self.path)})

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for connection in list(self._connections):  # front ends fall back at once
                connection.close()
            await self._server.wait_closed()
        if self.path.is_socket():
            self.path.unlink()


def claim(path: Path) -> None:
    """Removes a stale socket file left by a model process that died; refuses a live one, and a
    path that is not a socket at all (a mistyped path must not delete someone's file)."""
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    if path.is_symlink() or not path.is_socket():
        raise SocketInUse(f"{path}: exists and is not a socket; remove it or choose another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: a leftover
        return
    finally:
        probe.close()
    raise SocketInUse(f"{path}: another model process is serving on it")
