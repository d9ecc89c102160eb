"""Parses request bodies; a large one in a worker process, so the event loop never spends the
10-100 ms that reading a multi-MiB body takes while other requests wait behind it."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from extproc.request_body import ParsedBody, from_summary, parse_body, summarize
from router.config import RequestsConfig

log = logging.getLogger(__name__)

INLINE_LIMIT = 256 * 1024  # below this, parsing takes about a millisecond: not worth a hop


class BodyParser:
    def __init__(self, inline_limit: int = INLINE_LIMIT):
        self.inline_limit = inline_limit
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> asyncio.Future:
        """Starts the worker process now, off the request path; resolves to its pid. Started by the
        first large body instead, the worker's start (a fresh interpreter importing the parser: 0.3 s
        on an idle node, more on a busy one) counted against that request's deadline, which it missed
        under a CPU-bound neighbour."""
        started = asyncio.get_running_loop().run_in_executor(self._executor(), _ready)
        started.add_done_callback(_log_failure)
        return started

    async def parse(self, raw: bytes, path: str, policy: RequestsConfig, max_turns: int = 1) -> ParsedBody:
        """ParsedBody, or BadBody for an unusable body (as parse_body)."""
        if len(raw) <= self.inline_limit:
            return parse_body(raw, path, policy, max_turns)
        try:
            summary = await asyncio.get_running_loop().run_in_executor(
                self._executor(), summarize, raw, path, policy, max_turns)
        except BrokenProcessPool:  # the worker died (killed, out of memory): this body in-process, a new worker
            log.warning("body parser process died; parsing this body in-process")
            self._pool = None
            self.start()
            return parse_body(raw, path, policy, max_turns)
        return from_summary(raw, summary)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the router process runs threads (torch's among them).
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _ready() -> int:
    # Run in the worker, so that it imports this module, and with it the parser, before any body.
    return os.getpid()


def _log_failure(started: asyncio.Future) -> None:
    if not started.cancelled() and started.exception() is not None:
        # The next large body finds the pool broken and parses in-process: logged, not lost.
        log.warning("body parser process did not start", extra={"error": repr(started.exception())})
