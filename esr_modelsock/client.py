"""A front end's Embedder backed by the model process: one connection, many requests in flight.

While the model process is away (starting, restarting, gone) every request fails at once with
ModelUnavailable, which the engine turns into a fallback; the connection is retried in the
background, and `on_state` tells the owner (health) when it comes and goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from pathlib import Path
from typing import Callable, ContextManager

import numpy as np

from batching import BatcherClosed, BatcherError, DeadlineExceeded, ModelUnavailable
from esr_modelsock import wire

log = logging.getLogger(__name__)

_RETRY_FIRST_S, _RETRY_MAX_S = 0.05, 1.0


class _Link(wire.FramedProtocol):
    peer = "model process"

    def __init__(self, client: "ModelClient"):
        super().__init__()
        self._client = client
        self.hello: asyncio.Future = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future = asyncio.get_running_loop().create_future()

    def frames_received(self, frames: list[tuple[int, bytes]]) -> None:
        for kind, payload in frames:
            if kind == wire.VECTOR:
                self._client._settle(wire.request_id_of(payload), np.frombuffer(payload, np.float32, offset=4))
            elif kind == wire.ERROR:
                self._client._settle(*wire.error_of(payload))
            elif kind == wire.CLAIMED:
                request_id, taken = wire.claimed_of(payload)
                self._client._settle(request_id, taken)
            elif kind == wire.SCORE:
                shared = wire.score_of(payload)
                if shared is not None:
                    self._client.on_score(*shared)
            elif kind == wire.HELLO and not self.hello.done():
                self.hello.set_result(json.loads(payload))

    def connection_lost(self, exc) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if not self.hello.done():
            self.hello.set_exception(ConnectionError("closed before hello"))


def _identity(hello: dict) -> tuple:
    return hello.get("model"), hello.get("dimension"), hello.get("fingerprint")


class ModelClient:
    def __init__(self, path: str | Path, on_state: Callable[[bool], None] | None = None,
                 on_score: Callable[[str, float], None] | None = None,
                 token_ids: Callable[[dict | None], Callable[[str], bytes | None] | None] | None = None):
        """`token_ids`: given a model process's HELLO "tokens" (wire.py), what makes a text's token ids
        for it (bytes, or None: send that text as text), or None where this front end cannot
        (esr_model/token_ids.FrontEndTokens.maker); without it, texts go as text."""
        self.path = str(path)
        self._token_ids = token_ids
        self._make_ids: Callable[[str], bytes | None] | None = None  # for the model process connected now
        self.on_state = on_state or (lambda up: None)
        # A selection score another front end accepted (wire.SCORE): the owner folds it in as its own.
        self.on_score = on_score or (lambda selection_id, score: None)
        self.model: dict | None = None  # the model process's HELLO: model, dimension, pid
        # A tracer's span around each call (by name): the model process's queue and batch as the
        # request sees them. None: not traced.
        self.call_span: Callable[[str], ContextManager] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._transport: asyncio.Transport | None = None
        self._out: wire.FrameWriter | None = None
        self._up = asyncio.Event()  # set once the model process first answered
        self._runner: asyncio.Task | None = None
        self._closing = False

    @property
    def connected(self) -> bool:
        return self._out is not None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._runner = (loop or asyncio.get_running_loop()).create_task(self._stay_connected())

    async def started(self) -> None:
        """Returns once the model process has answered (it listens only when warm)."""
        await self._up.wait()

    async def _stay_connected(self) -> None:
        loop = asyncio.get_running_loop()
        delay, announced = _RETRY_FIRST_S, False
        while not self._closing:
            try:
                transport, link = await loop.create_unix_connection(lambda: _Link(self), self.path)
            except OSError as exc:
                if not announced:
                    log.warning("model process not reachable; retrying", extra={"socket": self.path,
                                                                               "error": type(exc).__name__})
                    announced = True
                await asyncio.sleep(delay)
                delay = min(_RETRY_MAX_S, delay * 2)
                continue
            try:
                hello = await asyncio.wait_for(link.hello, 10.0)
            except (ConnectionError, TimeoutError):
                transport.close()
                await asyncio.sleep(delay)
                continue
            if self.model is not None and _identity(hello) != _identity(self.model):
                # Routes were embedded by the first model: vectors of another would be scored
                # against them. Stay unavailable (NOT_SERVING, fallback_unavailable) until this
                # router restarts on the new model.
                log.error("model process serves another model than the routes were built with; restart the router",
                          extra={"socket": self.path, "was": _identity(self.model), "now": _identity(hello)})
                transport.close()
                self.on_state(False)
                await asyncio.sleep(_RETRY_MAX_S)
                continue
            self.model = hello
            # per connection: a model process restarted on another tokenizer takes text again
            self._make_ids = self._token_ids(hello.get("tokens")) if self._token_ids is not None else None
            self._transport, self._out = transport, wire.FrameWriter(transport, loop)
            self._up.set()
            delay, announced = _RETRY_FIRST_S, False
            log.info("model process connected", extra={"socket": self.path, "model_pid": self.model.get("pid"),
                                                       "sends": "token ids" if self._make_ids else "text"})
            self.on_state(True)
            await link.lost
            self._transport, self._out = None, None
            self._fail_pending(ModelUnavailable("model process connection lost"))
            if not self._closing:
                log.warning("model process connection lost; falling back until it is back", extra={"socket": self.path})
                self.on_state(False)

    async def embed(self, text: str, deadline: float, bulk: bool = False) -> np.ndarray:
        if self._closing:
            raise BatcherClosed("shutting down")
        out = self._out
        if out is None:
            raise ModelUnavailable("model process not connected")
        budget = deadline - time.monotonic()
        if budget <= 0:
            raise DeadlineExceeded("deadline passed before the request was sent")
        ids = self._make_ids(text) if self._make_ids is not None else None
        if ids is not None:
            request_id, fut = self._ask(out, lambda rid: wire.embed_ids_frame(rid, budget, ids, bulk))
        else:
            raw = text.encode("utf-8", "surrogatepass")
            if len(raw) > wire.MAX_TEXT:
                # refused for this request alone, as the model process would: a frame over MAX_FRAME
                # would make it drop the socket every front-end request shares
                raise BatcherError(f"model process: text of {len(raw)} bytes; at most {wire.MAX_TEXT}")
            request_id, fut = self._ask(out, lambda rid: wire.embed_frame(rid, budget, raw, bulk))
        try:
            async with asyncio.timeout_at(deadline):
                with self.call_span("semantic_router.model_socket") if self.call_span else contextlib.nullcontext():
                    return await fut
        except TimeoutError:
            self._cancel(request_id)
            raise DeadlineExceeded("deadline passed waiting for the model process") from None
        except asyncio.CancelledError:
            self._cancel(request_id)
            raise
        finally:
            self._pending.pop(request_id, None)

    async def claim_score(self, key: str, selection_id: str, score: float, deadline: float) -> bool | None:
        """Asks the model process to take a score this front end verified (`key`: its request's): True
        taken, and passed on to the pool's other front ends; False: another front end took that
        request's score already. None where the model process did not answer by `deadline` (the
        posting request's, time.monotonic(): not connected, or away): this front end decides alone,
        and the others do not learn of it."""
        out = self._out
        if out is None or self._closing:
            return None
        request_id, fut = self._ask(out, lambda rid: wire.claim_frame(rid, key, selection_id, score))
        try:
            async with asyncio.timeout_at(deadline):
                taken = await fut
        except (TimeoutError, BatcherError):
            return None
        finally:
            self._pending.pop(request_id, None)
        return not taken

    def _ask(self, out: wire.FrameWriter, frame: Callable[[int], bytes]) -> tuple[int, asyncio.Future]:
        """Sends the frame of a new request id, its answer awaited in `_pending` (`_settle`)."""
        request_id = next(self._ids) & 0xFFFFFFFF
        fut = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        out.write(frame(request_id))
        return request_id, fut

    def _cancel(self, request_id: int) -> None:
        if self._out is not None and request_id in self._pending:
            self._out.write(wire.cancel_frame(request_id))

    def _settle(self, request_id: int, outcome) -> None:
        fut = self._pending.get(request_id)
        if fut is None or fut.done():
            return  # given up on already
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)

    def _fail_pending(self, exc: Exception) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)

    async def aclose(self, drain_timeout: float = 10.0) -> None:
        """Stops taking requests; those in flight get their answers for up to `drain_timeout`."""
        self._closing = True
        end = time.monotonic() + drain_timeout
        while self._pending and time.monotonic() < end:
            await asyncio.sleep(0.01)
        self._fail_pending(BatcherClosed("shutting down"))
        if self._transport is not None:
            self._transport.close()
        if self._runner is not None:
            self._runner.cancel()
