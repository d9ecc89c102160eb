"""Parses request bodies within the request's deadline, and never holds the event loop for one:
a body whose shape makes it costly goes to a worker process.

What a body costs to scan and decode is set by its structural characters (quotes, braces,
brackets), not its length (docs/bad-input.md; `python -m bench.frontend.adversarial_parse`). So
only a body small in both bytes and structure is parsed on the loop (a few milliseconds at most);
anything else, and every body too large to parse (scanned for its model and a repeated key), goes
to the worker, with its request's deadline: the scan stops itself there (json_scan.OutOfTime),
so no body holds the worker past its own deadline for the bodies behind it, and the request falls
back at its deadline (ParseTimeout). Only a job still running STUCK_S after its deadline (the scan
was not where the time went) is ended with its worker, which is then replaced.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

from esr_extproc.children import die_with_parent
from esr_extproc.encodings import inflate
from esr_extproc.json_scan import OutOfTime, scan_unread, structure
from esr_extproc.request_body import ParsedBody, ReadOptions, from_summary, parse_body, summarize

log = logging.getLogger(__name__)

INLINE_BYTES = 64 * 1024  # plain text this long decodes in about a millisecond
INLINE_STRUCTURE = 1024  # structural characters: a few ms at the worst cost per character (bench.frontend.adversarial_parse)
STUCK_S = 1.0
PARSER_NICE = 10  # added to the worker's niceness: a tenth of a router thread's weight under contention


class ParseTimeout(Exception):
    """The body was not parsed by the request's deadline."""


class ParserUnavailable(Exception):
    """The worker process died on this body twice (or could not start)."""


class BodyParser:
    def __init__(self, inline_bytes: int = INLINE_BYTES, inline_structure: int = INLINE_STRUCTURE):
        self.inline_bytes = inline_bytes
        self.inline_structure = inline_structure
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> asyncio.Future:
        """Starts the worker process now, off the request path; resolves to its pid. Started by the
        first large body instead, the worker's start (a fresh interpreter importing the parser: 0.3 s
        on an idle node, more on a busy one) counted against that request's deadline, which it missed
        under a CPU-bound neighbour."""
        started = asyncio.wrap_future(self._executor().submit(_ready))
        started.add_done_callback(_log_failure)
        return started

    def inline(self, raw: bytes) -> bool:
        return len(raw) <= self.inline_bytes and structure(raw) <= self.inline_structure

    async def parse(self, raw: bytes, path: str, read: ReadOptions = ReadOptions(),
                    deadline: float | None = None) -> ParsedBody:
        """ParsedBody, or BadBody for an unusable body (as parse_body); ParseTimeout at `deadline`
        (time.monotonic()); ParserUnavailable when the worker cannot parse it."""
        if self.inline(raw):
            return parse_body(raw, path, read)
        summary = await self._in_worker(summarize, (raw, path, read, deadline), deadline)
        return from_summary(raw, summary)

    async def scan_unread(self, raw: bytes, deadline: float | None = None) -> tuple[str | None, tuple[int, int] | None]:
        """scan_unread (the model of a body too large to parse, a repeated top-level key refused)
        off the event loop."""
        if self.inline(raw):
            return scan_unread(raw)
        return await self._in_worker(scan_unread, (raw, deadline), deadline)

    async def inflate(self, raw: bytes, encoding: str, limit: int, deadline: float | None = None) -> bytes:
        """The body inflated (encodings.inflate), always in the worker: a few bytes may inflate a
        thousandfold."""
        return await self._in_worker(inflate, (raw, encoding, limit), deadline)

    async def _in_worker(self, fn: Callable, args: tuple, deadline: float | None) -> Any:
        for attempt in (1, 2):
            pool = self._executor()
            try:
                return await self._until(pool.submit(fn, *args), deadline)
            except BrokenProcessPool:
                # The worker died (killed, out of memory, or ended for a job that overran): a new
                # one takes this body once; a body that kills it twice is not retried again.
                log.warning("body parser process died", extra={"attempt": attempt})
                self._replace(pool)
        raise ParserUnavailable("body parser process died twice on this body")

    async def _until(self, job: Future, deadline: float | None) -> Any:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job)), timeout)
        except OutOfTime:
            raise ParseTimeout() from None
        except TimeoutError:
            if not job.cancel():  # started: it stops itself at the deadline, or is ended as stuck
                asyncio.get_running_loop().call_later(STUCK_S, self._if_stuck, job, self._pool)
            raise ParseTimeout() from None

    def _if_stuck(self, job: Future, pool: ProcessPoolExecutor | None) -> None:
        if not job.done():
            log.warning("body parse stuck past its deadline; restarting the parser process")
            self._replace(pool, kill=True)

    def _replace(self, pool: ProcessPoolExecutor | None, kill: bool = False) -> None:
        if pool is None or pool is not self._pool:
            return  # already replaced by another request
        if kill:
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        self.start()

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the router process runs threads (torch's among them). The worker
            # goes with the router, however the router dies. Made on the event loop's thread.
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_starts)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _worker_starts() -> None:
    die_with_parent()
    # What the worker parses is the costly shapes: on a busy node they get the CPU the router's own
    # threads leave, not an equal share of it (beside a dozen costly bodies and two CPU-bound
    # neighbours, ordinary requests' slowest decision was 54-91 ms against 76-118 ms unniced).
    os.nice(PARSER_NICE)


def _ready() -> int:
    # Run in the worker, so that it imports this module, and with it the parser, before any body.
    return os.getpid()


def _log_failure(started: asyncio.Future) -> None:
    if not started.cancelled() and started.exception() is not None:
        # The next large body finds the pool broken and tries a new worker: logged, not lost.
        log.warning("body parser process did not start", extra={"error": repr(started.exception())})
