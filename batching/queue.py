"""The bounded, thread-safe queue of tokenized requests and the rule that cuts batches from it."""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
import contextvars
from typing import Any, Callable, Protocol, Sized

from batching.cost_model import BatchCostModel

# The most padded tokens bulk items add to a batch before the cost model has data (about one of the
# prompt guard's pieces: 256 held a prompt ~130 ms on 2 cores; the slice once it has).
BULK_COLD_TOKENS = 64


class Reply(Protocol):
    """Where a request's outcome goes, on the event loop: an asyncio.Future, or a caller's own
    object that answers at once (the model socket writes the vector to its front end)."""

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException) -> None: ...


@dataclass(eq=False)
class WorkItem:
    text: str
    deadline: float  # time.monotonic() seconds
    future: Reply
    enqueued_at: float  # on the queue's clock (BatchQueue.new_item)
    # What the backend's tokenize made of the text (token ids for a local model); its len() is
    # the token count that batch budgets and the cost model are kept in. Bytes until the tokenizer
    # thread reads them: token ids the caller made (Backend.read_ids), `text` then empty.
    inputs: Sized = ()
    # Set on the event loop when the caller stops waiting; read by the threads. A stale read only
    # costs one wasted embedding, so no lock.
    cancelled: bool = False
    # The submitting task's context, kept only for a batch hook (a tracer finds the request's span
    # in it); opaque to the batcher.
    origin: contextvars.Context | None = None
    # One of many texts one request sent together (the prompt guard's pieces): it never goes before
    # a request's own prompt, and adds at most the queue's bulk slice to any batch (BatchQueue).
    bulk: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.inputs)


@dataclass
class Batch:
    items: list[WorkItem]
    expired: list[WorkItem]
    cancelled: list[WorkItem]
    late: list[WorkItem] = field(default_factory=list)  # predicted to finish after their deadline
    predicted_s: float = 0.0  # what the cost model expects this batch to take

    # Counted once: the model thread reads them several times a batch (cost model, load, metrics).
    @functools.cached_property
    def tokens(self) -> int:
        return sum(i.n_tokens for i in self.items)

    @functools.cached_property
    def padded_tokens(self) -> int:
        return max((i.n_tokens for i in self.items), default=0) * len(self.items)


def choose_batch(window: list[WorkItem], max_size: int, max_tokens: int, max_padding: float = 1.0) -> list[int]:
    """Indices into `window` (oldest first) forming the next batch.

    The oldest request is always in the batch, so nobody starves. The batch grows by the
    neighbour closest in token length (shorter first on ties: it adds no padding) while it
    stays within `max_size`, `max_tokens` padded tokens (longest x count, what the model pays)
    and `max_padding` (the share of padded tokens that are padding).
    """
    lens = [i.n_tokens for i in window]
    if max_padding >= 1.0 and len(window) <= max_size and max(lens) * len(window) <= max_tokens:
        return list(range(len(window)))  # all of them fit: the growth below would take every one
    order = sorted(range(len(window)), key=lens.__getitem__)
    lens = [lens[i] for i in order]
    lo = hi = order.index(0)
    useful = longest = lens[lo]

    def fits(add: int, new_longest: int, n: int) -> bool:
        padded = new_longest * n
        return padded <= max_tokens and 1.0 - (useful + add) / padded <= max_padding

    while hi - lo + 1 < max_size:
        n = hi - lo + 2
        left = lo > 0 and fits(lens[lo - 1], longest, n)
        right = hi + 1 < len(lens) and fits(lens[hi + 1], lens[hi + 1], n)
        if left and (not right or longest - lens[lo - 1] <= lens[hi + 1] - longest):
            lo -= 1
            useful += lens[lo]
        elif right:
            hi += 1
            useful += lens[hi]
            longest = lens[hi]
        else:
            break
    return order[lo : hi + 1]


class BatchQueue:
    """Two FIFOs of admitted requests, bounded together in requests and tokens: texts that are a
    request's own (its prompt) and bulk ones (many from one request: the prompt guard's pieces).

    Admission is two-step because token counts are only known after tokenization: `reserve()`
    takes a request slot at submission (on the event loop, never blocking), `put()` adds the
    tokenized item and enforces the token bound.

    A batch is cut from the own texts first; bulk ones fill it only while they add at most
    `bulk_slice_s` of predicted time (BULK_COLD_TOKENS padded tokens before the cost model has
    data), and a batch of bulk texts alone is no longer: a request's prompt waits behind another
    request's pieces for about one slice, and is never refused for their sake (admission counts
    only the own texts queued: `own_depth`). One request's hundred guard pieces once held the
    model for seconds, and the prompts behind them were refused (fallback_overload).
    """

    def __init__(self, max_requests: int, max_tokens: int, window: int, clock: Callable[[], float] = time.monotonic,
                 bulk_slice_s: float = 0.02):
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.window = window
        self.bulk_slice_s = bulk_slice_s
        self._clock = clock
        self._items: deque[WorkItem] = deque()
        self._bulk: deque[WorkItem] = deque()
        self._reserved = 0
        self._tokens = 0
        self._reserved_bulk = 0
        self._tokens_bulk = 0
        self._closed = False
        self._running = 0  # batches cut and not yet done (several where the batcher has lanes)
        self._idle_since = clock()  # when the last running batch was done
        self._cond = threading.Condition()

    def new_item(self, text: str, deadline: float, future: Reply, bulk: bool = False) -> WorkItem:
        """A request submitted now, stamped with this queue's clock (what top-up waits are timed on)."""
        return WorkItem(text=text, deadline=deadline, future=future, enqueued_at=self._clock(), bulk=bulk)

    @property
    def depth(self) -> tuple[int, int]:
        return self._reserved, self._tokens

    @property
    def own_depth(self) -> tuple[int, int, int]:
        """(reserved, tokenized, tokens) of the own texts: what a request's prompt waits for."""
        return self._reserved - self._reserved_bulk, len(self._items), self._tokens - self._tokens_bulk

    def reserve(self, n: int = 1, bulk: bool = False) -> int:
        """Takes up to `n` request slots; how many it took (0 when closed or full)."""
        with self._cond:
            if self._closed:
                return 0
            granted = max(0, min(n, self.max_requests - self._reserved))
            self._reserved += granted
            self._reserved_bulk += granted if bulk else 0
            return granted

    def release(self, n: int = 1, bulk: int = 0) -> None:
        """Gives back `n` slots, `bulk` of them bulk ones."""
        with self._cond:
            self._reserved -= n
            self._reserved_bulk -= bulk
            self._cond.notify_all()

    def put_many(self, items: list[WorkItem]) -> list[WorkItem]:
        """Queue items in order under one lock (so the model thread sees them together).
        Returns those refused because the token bound would be exceeded."""
        refused = []
        with self._cond:
            for item in items:
                if self._tokens + item.n_tokens > self.max_tokens:
                    refused.append(item)
                    continue
                (self._bulk if item.bulk else self._items).append(item)
                self._tokens += item.n_tokens
                self._tokens_bulk += item.n_tokens if item.bulk else 0
            self._cond.notify_all()
        return refused

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def queued(self) -> int:
        """Tokenized items waiting (reserved slots also count those not yet tokenized)."""
        return len(self._items) + len(self._bulk)

    def next_batch(
        self, max_size: int, max_tokens: int, max_padding: float = 1.0, max_wait: float = 0.0,
        cost: BatchCostModel | None = None, margin: float = 0.0,
    ) -> Batch | None:
        """Block until there is work; None once closed and nothing is left reserved. Call `done()`
        when a batch with items has run.

        A batch is cut while no other batch runs, or once a full one (`max_size`) is waiting:
        while one runs, what arrives forms the next batch instead of going out in small ones
        (a lane's own call costs the remote engine as much as a batch's).
        With a ready `cost` model no item is computed that is predicted to finish (plus `margin`)
        after its deadline, and the batch is cut no larger than its oldest item's deadline allows.
        """
        with self._cond:
            while not self.queued or (self._running and self.queued < max_size and not self._closed):
                if self._closed and self._reserved == 0:
                    return None
                self._cond.wait(0.1)
            if max_wait > 0 and self._items:
                self._top_up(max_size, max_wait)
            # Own texts first, oldest first; then bulk ones, oldest first.
            window = [self._items.popleft() for _ in range(min(self.window, len(self._items)))]
            window += [self._bulk.popleft() for _ in range(min(self.window, len(self._bulk)))]
            now = self._clock()
            expired = [i for i in window if not i.cancelled and not i.deadline > now]  # NaN too: never lost
            cancelled = [i for i in window if i.cancelled]
            live = [i for i in window if not i.cancelled and i.deadline > now]
            judge = cost if cost is not None and cost.ready else None  # no predictions before it has data
            late: list[WorkItem] = []
            probe: WorkItem | None = None
            if judge is not None:
                # Even alone it would answer too late: refuse now rather than compute for nobody.
                keep: list[WorkItem] = []
                for i in live:
                    (late if now + judge.predict(i.n_tokens) + margin > i.deadline else keep).append(i)
                if not keep and self._running == 0:
                    # The oldest with more time left than its answer needs to get back.
                    oldest = next((i for i in late if i.deadline - now > margin), None)
                    if oldest is not None and now - self._idle_since >= judge.predict(oldest.n_tokens):
                        # Nothing has run for longer than the prediction says one batch takes: it
                        # is only history (a model slow for a while), and refusing everything would
                        # never show the model fast again. It runs alone.
                        late.remove(oldest)
                        keep = [oldest]
                        probe = oldest
                live = keep
            chosen: list[WorkItem] = []
            predicted = 0.0
            own = [i for i in live if not i.bulk]
            bulk = [i for i in live if i.bulk]
            if live:
                first = (own or bulk)[0]
                budget = max_tokens
                if judge is not None:  # the oldest item must still meet its deadline
                    within = judge.max_tokens_within(first.deadline - now - margin)
                    budget = int(min(max_tokens, max(first.n_tokens, within)))
                if own:
                    chosen = [own[i] for i in sorted(choose_batch(own, max_size, budget, max_padding))]
                # Bulk items never make the request's own texts late.
                within = min((i.deadline for i in chosen), default=math.inf) - now - margin
                chosen += self._bulk_share(chosen, bulk, max_size, budget, judge, within)
                picked = {id(i) for i in chosen}
                if judge is not None:
                    predicted = judge.predict(max(i.n_tokens for i in chosen) * len(chosen))
                    finish = now + predicted + margin
                    late += [i for i in chosen if i.deadline < finish and i is not probe]
                    chosen = [i for i in chosen if i.deadline >= finish or i is probe]
                self._items.extendleft(reversed([w for w in own if id(w) not in picked]))
                self._bulk.extendleft(reversed([w for w in bulk if id(w) not in picked]))
            gone = chosen + expired + cancelled + late
            self._tokens -= sum(i.n_tokens for i in gone)
            self._reserved -= len(gone)
            self._tokens_bulk -= sum(i.n_tokens for i in gone if i.bulk)
            self._reserved_bulk -= sum(i.bulk for i in gone)
            self._running += bool(chosen)
            self._cond.notify_all()
            return Batch(chosen, expired, cancelled, late, predicted)

    def _bulk_share(self, chosen: list[WorkItem], bulk: list[WorkItem], max_size: int, budget: int,
                    judge: BatchCostModel | None, within_s: float) -> list[WorkItem]:
        """The bulk items (oldest first) that join `chosen`: while the batch stays within `max_size`
        and `budget`, is predicted to end within `within_s`, and they add at most the slice of
        predicted time (at least one where nothing else is chosen, so bulk work always moves)."""
        added: list[WorkItem] = []
        longest = max((i.n_tokens for i in chosen), default=0)
        base = longest * len(chosen)
        before = judge.predict(base) if judge is not None and chosen else 0.0
        for item in bulk:
            n = len(chosen) + len(added) + 1
            padded = max(longest, item.n_tokens) * n
            if n > max_size or padded > budget:
                break
            if judge is not None:
                took = judge.predict(padded)
                over = took - before > self.bulk_slice_s or (chosen and took > within_s)
            else:
                over = padded - base > BULK_COLD_TOKENS
            if over and (added or chosen):
                break
            added.append(item)
            longest = max(longest, item.n_tokens)
        return added

    def idle_for(self) -> float:
        """Seconds since the last batch was done, with nothing running; 0 while one runs."""
        with self._cond:
            return 0.0 if self._running else self._clock() - self._idle_since

    def done(self) -> None:
        """A batch with items that next_batch handed out has run."""
        with self._cond:
            self._running -= 1
            if not self._running:
                self._idle_since = self._clock()
            self._cond.notify_all()

    def _top_up(self, max_size: int, max_wait: float) -> None:
        # Optional latency-for-throughput trade: give a tiny batch a moment to grow.
        give_up_at = self._items[0].enqueued_at + max_wait
        while self.queued < max_size and not self._closed:
            remaining = give_up_at - self._clock()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
