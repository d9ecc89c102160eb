"""The continuous batcher: an asyncio front, a tokenizer thread and one model thread per lane.

Pipeline (after TEI's queue / batching task / backend task split):
  event loop  -- embed(): reserve a queue slot, or refuse at once when the queue is full or the
                 learned batch cost says the answer would come after the deadline; hand the
                 text to the tokenizer
  tokenizer   -- tokenizes whatever arrived, in one call, while the model runs the current batch
  model       -- warms the backend up, then cuts the next batch when the model frees (natural
                 batching: never waits idle) no larger than its oldest item's deadline allows,
                 refuses items predicted to finish late, runs it, learns its cost, settles all
                 its futures with one call back into the loop
  lanes       -- one for a model this process runs (one thread owns it); several for a remote
                 engine, so that batches are in flight together (the engine batches again)
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import queue as stdqueue
import threading
import time
from typing import Any, Callable, Sequence, Sized

import numpy as np

from batching.admission import LoadEstimate
from batching.backend import Backend
from batching.cost_model import BatchCostModel
from batching.errors import BatcherClosed, BatcherError, DeadlineExceeded, Overloaded, TextTooLong, WouldMissDeadline
from batching.observer import BatchObserver, NullObserver
from batching.queue import Batch, BatchQueue, Reply, WorkItem
from batching.settings import BatcherSettings

# (the batch's items, its tokens, its start and end in time.time_ns(), each item's queue wait in s)
BatchHook = Callable[[Sequence[WorkItem], int, int, int, Sequence[float]], None]

log = logging.getLogger(__name__)

_TOKENIZE_CHUNK = 512


class ContinuousBatcher:
    # Set by start(): embed() needs a started batcher.
    _loop: asyncio.AbstractEventLoop
    _warm: asyncio.Future

    def __init__(self, backend: Backend[Any], settings: BatcherSettings = BatcherSettings(),
                 observer: BatchObserver | None = None, lanes: int = 1):
        if lanes < 1:
            raise ValueError("lanes must be at least 1")
        self.backend = backend
        self.lanes = lanes
        self.settings = settings
        self.observer = observer or NullObserver()
        self._queue = BatchQueue(settings.max_queue_requests, settings.max_queue_tokens, settings.sort_window,
                                 bulk_slice_s=settings.bulk_slice_ms / 1000.0)
        self._inbox: stdqueue.SimpleQueue[list[WorkItem] | None] = stdqueue.SimpleQueue()
        self._arrivals: list[WorkItem] = []  # this loop iteration's submissions, handed over together
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._warmed = threading.Event()  # lane 0 has warmed the backend up (or failed to)
        self._warm_failed = False
        self.cost = BatchCostModel()
        # Called from the model thread after each batch with what it served (BatchHook); set by
        # whoever traces batches, before start(). None: nothing kept per request for it.
        self.batch_hook: BatchHook | None = None
        self._load = LoadEstimate(settings, lanes, self.cost)
        # How late the loop runs a callback the model thread hands it: a busy loop delays every
        # answer by this much. Rises at once, decays slowly (written on the loop only).
        self._settle_delay = 0.0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._warm = self._loop.create_future()
        self._threads = [
            threading.Thread(target=self._tokenizer_loop, name="batcher-tokenizer", daemon=True),
        ] + [
            threading.Thread(target=self._model_loop, args=(lane,), name="batcher-model" + (f"-{lane}" if lane else ""),
                             daemon=True)
            for lane in range(self.lanes)
        ]
        for t in self._threads:
            t.start()

    async def started(self) -> None:
        """Returns once the model thread has warmed the backend up; raises what warm-up raised."""
        await asyncio.shield(self._warm)

    async def aclose(self, drain_timeout: float = 10.0) -> None:
        """Stop taking work, answer everything already queued, then stop the threads."""
        self._closing = True
        if self._arrivals:  # hand over this iteration's submissions before the stop marker
            self._hand_over()
        self._inbox.put(None)
        loop = asyncio.get_running_loop()
        # The tokenizer must finish first so that what it still holds is queued before close().
        await loop.run_in_executor(None, self._threads[0].join, drain_timeout)
        self._queue.close()
        until = time.monotonic() + drain_timeout
        for lane in self._threads[1:]:
            await loop.run_in_executor(None, lane.join, max(0.0, until - time.monotonic()))
        close = getattr(self.backend, "close", None)  # optional: what a backend holds beyond its batches
        if close is not None:
            close()

    # -- the event-loop side ---------------------------------------------------------------

    @property
    def depth(self) -> tuple[int, int]:
        """(requests, tokens) waiting."""
        return self._queue.depth

    async def embed(self, text: str, deadline: float, bulk: bool = False) -> np.ndarray:
        """The embedding of `text`, or BatcherError; never waits past `deadline` (monotonic).
        `bulk`: one of many texts its request sent together (WorkItem.bulk)."""
        fut = self._loop.create_future()
        item = self.submit(text, deadline, fut, bulk)
        if self.batch_hook is not None:
            item.origin = contextvars.copy_context()
        try:
            async with asyncio.timeout_at(deadline):
                return await fut
        except TimeoutError:
            item.cancelled = True
            raise DeadlineExceeded("deadline passed while queued or running") from None
        except asyncio.CancelledError:
            item.cancelled = True
            raise

    def submit(self, text: str, deadline: float, reply: Reply, bulk: bool = False) -> WorkItem:
        """Queues `text` without a task, timer or future of its own: `reply` is settled on the event
        loop, once, when its batch has run (or with DeadlineExceeded when a batch is cut after its
        deadline). Raises BatcherError at once when refused. A caller that stops waiting sets the
        returned item's `cancelled`. For callers that keep their own deadline (the model socket's
        front ends do); call on the event loop."""
        (outcome,) = self.submit_many(((text, deadline, reply),), bulk)
        if isinstance(outcome, BatcherError):
            raise outcome
        return outcome

    def submit_many(self, requests: Sequence[tuple[str | bytes, float, Reply]], bulk: bool = False
                    ) -> list[WorkItem | BatcherError]:
        """submit() for requests that arrived together (a front end's frames of one read), each
        (text, deadline, reply): queued (its WorkItem) or refused (the error submit would raise).
        A text given as bytes is token ids its caller made (the backend's read_ids reads them, in
        place of tokenize: Backend).
        One admission for the lot: the wait predicted for the last of them is judged against each
        one's deadline, so a request is never admitted that submit would refuse. A request's own
        text is judged by the own texts queued only: bulk ones give way to it (BatchQueue)."""
        if self._closing:
            return [BatcherClosed("batcher is shutting down")] * len(requests)
        out: list[WorkItem | BatcherError] = []
        valid: list[int] = []
        for n, (text, deadline, _reply) in enumerate(requests):
            if not math.isfinite(deadline):  # NaN is neither expired nor live: it would hold a queue slot
                out.append(DeadlineExceeded(f"deadline {deadline!r} is not a time"))
            elif len(text) > self.settings.max_text_chars:
                self.observer.on_dropped("too_long", 1)
                out.append(TextTooLong(f"text of {len(text)} characters, over max_text_chars "
                                       f"{self.settings.max_text_chars}"))
            else:
                out.append(None)  # type: ignore[arg-type]  # decided below
                valid.append(n)
        if not valid:
            return out
        # Whether the first of these finds the batcher with nothing queued (the idle escape, below).
        alone = self._queue.depth[0] == 0 and not self._arrivals
        granted = self._queue.reserve(len(valid), bulk)
        if granted < len(valid):
            self.observer.on_dropped("overload", len(valid) - granted)
            for n in valid[granted:]:
                out[n] = Overloaded(f"queue holds {self._queue.max_requests} requests")
            valid = valid[:granted]
        now = time.monotonic()
        wait = self.predicted_wait(bulk) if valid else 0.0
        late = 0
        for k, n in enumerate(valid):
            text, deadline, reply = requests[n]
            if now + wait > deadline and not (k == 0 and alone and self._idle_past(wait, deadline - now)):
                late += 1
                out[n] = WouldMissDeadline(f"predicted answer in {wait * 1000:.0f} ms, after the deadline")
                continue
            if isinstance(text, bytes):
                item = out[n] = self._queue.new_item("", deadline, reply, bulk)
                item.inputs = text
            else:
                item = out[n] = self._queue.new_item(text, deadline, reply, bulk)
            if not self._arrivals:
                self._loop.call_soon(self._hand_over)
            self._arrivals.append(item)
        if late:
            self._queue.release(late, late if bulk else 0)
            self.observer.on_dropped("overload", late)
        return out

    def _idle_past(self, wait: float, slack: float) -> bool:
        """A batcher idle for longer than it predicts admits all the same (the first request that
        finds nothing queued: submit_many): its prediction is then only history (a model that was
        slow for a while), and refusing every request would never let a batch run to show it fast
        again. Not a request with no more time than its answer needs to get back (the margin): no
        model is that fast, and under load (a static tier deciding most requests on the loop, the
        model's queue idle between them) it only timed out."""
        return slack > self.margin and self._queue.idle_for() >= wait

    def predicted_wait(self, bulk: bool = False) -> float:
        """Seconds until a request admitted now would have its embedding: until a lane may cut a
        batch, then every batch needed for what is queued before it (this request included), lanes
        at a time. Before a request's own text only the own texts queue (bulk ones give way)."""
        if bulk:
            reserved, tokens = self._queue.depth
            queued = self._queue.queued
        else:
            reserved, queued, tokens = self._queue.own_depth
        return self._load.predicted_wait(reserved, queued, tokens, self.margin)

    def _hand_over(self) -> None:
        # One hand-off per loop iteration, not per request: clients that resume together
        # (a batch just settled) reach the tokenizer, and then the model, together.
        arrivals, self._arrivals = self._arrivals, []
        if arrivals:
            self._inbox.put(arrivals)

    @property
    def margin(self) -> float:
        """What to keep in hand before a deadline for the answer to get back to the caller."""
        return self.settings.answer_margin_s + self._settle_delay

    def _settle(self, items: Sequence[WorkItem], outcomes: Sequence[object], sent: float) -> None:
        self._settle_delay = max(time.monotonic() - sent, 0.98 * self._settle_delay)
        for item, outcome in zip(items, outcomes):
            if item.future.done():
                continue
            if isinstance(outcome, BaseException):
                item.future.set_exception(outcome)
            else:
                item.future.set_result(outcome)

    def _settle_from_thread(self, items: Sequence[WorkItem], outcomes: Sequence[object]) -> None:
        if items:
            try:
                self._loop.call_soon_threadsafe(self._settle, list(items), list(outcomes), time.monotonic())
            except RuntimeError:  # loop already closed: nobody is waiting any more
                pass

    # -- tokenizer thread ------------------------------------------------------------------

    def _tokenizer_loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._inbox.get()
            items = [] if first is None else list(first)
            stopping = first is None
            while len(items) < _TOKENIZE_CHUNK:
                try:
                    nxt = self._inbox.get_nowait()
                except stdqueue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    continue
                items.extend(nxt)
            self._admit(items)

    def _admit(self, items: list[WorkItem]) -> None:
        live = [i for i in items if not i.cancelled]
        if len(live) < len(items):
            self._queue.release(len(items) - len(live), sum(i.bulk for i in items if i.cancelled))
            self.observer.on_dropped("cancelled", len(items) - len(live))
        if not live:
            return
        made = [i for i in live if i.inputs.__class__ is bytes]  # token ids a front end made
        texts = [i for i in live if i.inputs.__class__ is not bytes] if made else live
        if made:
            self.observer.on_tokenized("caller", len(made))
        if texts:
            self.observer.on_tokenized("batcher", len(texts))
        read, tokenized = iter(self._read(made)), iter(self._tokenize(texts))
        failed: list[WorkItem] = []
        errors: list[object] = []
        ready: list[WorkItem] = []
        for item in live:  # in the order they arrived
            tok = next(read) if item.inputs.__class__ is bytes else next(tokenized)
            if isinstance(tok, Exception):
                failed.append(item)
                errors.append(tok)
            else:
                item.inputs = tok
                ready.append(item)
        for item in self._queue.put_many(ready):
            failed.append(item)
            errors.append(Overloaded(f"queue holds {self._queue.max_tokens} tokens"))
            self.observer.on_dropped("overload", 1)
        if failed:
            self._queue.release(len(failed), sum(i.bulk for i in failed))
            self._settle_from_thread(failed, errors)
        self.observer.on_queue_depth(*self._queue.depth)

    def _tokenize(self, items: list[WorkItem]) -> list[Sized | Exception]:
        if not items:
            return []
        try:
            return list(self.backend.tokenize([i.text for i in items]))
        except Exception as exc:  # one bad text must not fail its neighbours
            log.warning("batch tokenization failed, retrying singly: %s", type(exc).__name__)
        ids: list[Sized | Exception] = []
        for i in items:
            try:
                ids.append(self.backend.tokenize([i.text])[0])
            except Exception as one_exc:
                ids.append(one_exc)
        return ids

    def _read(self, items: list[WorkItem]) -> list[Sized | Exception]:
        read = getattr(self.backend, "read_ids", None)
        ids: list[Sized | Exception] = []
        for i in items:
            try:
                if read is None:
                    raise ValueError("this model takes text, not token ids")
                ids.append(read(i.inputs))
            except Exception as exc:  # one request's bad ids fail it alone
                ids.append(exc)
        return ids

    # -- model thread ----------------------------------------------------------------------

    def _model_loop(self, lane: int) -> None:
        s = self.settings
        if lane == 0:
            self._warm_up()
        else:
            self._warmed.wait()
        if self._warm_failed:
            return
        if lane:
            self.backend.prepare_thread()
        while True:
            batch = self._queue.next_batch(
                s.batch_size, s.max_batch_tokens, s.padding, s.max_wait_s, self.cost, self.margin
            )
            if batch is None:
                return
            try:
                self._run_batch(batch, lane)
            except Exception:  # the model thread must survive anything a batch does
                log.exception("batch handling failed")
                self._settle_from_thread(batch.items, [RuntimeError("batch failed")] * len(batch.items))
            finally:
                if batch.items:
                    self._queue.done()

    def _warm_up(self) -> None:
        try:
            # On this thread, not the caller's: per-thread runtime state (torch's thread pool)
            # must be built where the batches will run.
            self.backend.prepare_thread()
            timed = self.backend.warmup()
            if timed:
                self.cost.calibrate(timed)
        except Exception as exc:
            log.exception("backend warm-up failed")
            self._warm_failed = True
            self._closing = True  # a model that cannot warm up takes no work: callers fail at once
            self._loop.call_soon_threadsafe(_resolve, self._warm, exc)
        else:
            self._loop.call_soon_threadsafe(_resolve, self._warm, None)
        finally:
            self._warmed.set()

    def _run_batch(self, batch: Batch, lane: int = 0) -> None:
        if batch.expired:
            self.observer.on_dropped("expired", len(batch.expired))
            self._settle_from_thread(batch.expired, [DeadlineExceeded("expired in queue")] * len(batch.expired))
        if batch.cancelled:
            self.observer.on_dropped("cancelled", len(batch.cancelled))
        if batch.late:
            self.observer.on_dropped("late", len(batch.late))
            self._settle_from_thread(batch.late, [WouldMissDeadline("predicted to finish late")] * len(batch.late))
        items = batch.items
        if not items:
            return
        started = time.monotonic()
        self._load.batch_started(lane, batch)
        waits = [started - i.enqueued_at for i in items]
        t0 = time.perf_counter()
        started_ns = time.time_ns()
        learned: float | None = None
        try:
            vectors = self.backend.embed([i.inputs for i in items], max(i.deadline for i in items))
            outcomes: list[object] = list(vectors)
            learned = time.perf_counter() - t0
        except BatcherError as exc:  # not about these inputs (an engine that is down): no retries
            log.debug("batch of %d failed: %s", len(items), exc)  # the backend logs state changes
            outcomes = [exc] * len(items)
            self.observer.on_dropped("error", len(items))
        except Exception as exc:
            if len(items) > 1:
                log.warning("batch of %d failed (%s), isolating by retrying singly", len(items), type(exc).__name__)
                outcomes = [self._embed_one(i) for i in items]
            else:
                log.warning("embedding failed (%s)", type(exc).__name__)
                outcomes = [exc]
            bad = sum(isinstance(o, BaseException) for o in outcomes)
            if bad:
                self.observer.on_dropped("error", bad)
        inference_s = time.perf_counter() - t0
        self._load.batch_ended(lane, batch, learned)
        self.observer.on_batch(len(items), batch.tokens, batch.padded_tokens, inference_s, waits)
        if self.batch_hook is not None:
            try:
                self.batch_hook(items, batch.tokens, started_ns, time.time_ns(), waits)
            except Exception as exc:  # a tracer's failure costs the trace, never the batch
                log.warning("batch hook failed: %s", type(exc).__name__)
        self.observer.on_queue_depth(*self._queue.depth)
        self._settle_from_thread(items, outcomes)

    def _embed_one(self, item: WorkItem) -> object:
        try:
            return self.backend.embed([item.inputs], item.deadline)[0]
        except Exception as exc:
            return exc


def _resolve(fut: asyncio.Future, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
