"""How many torch threads the model thread uses, chosen batch by batch from what batches cost.

Why not a fixed number: a forward pass is ~40 parallel regions, and each waits at its barrier for
its slowest thread. On a machine to itself, two threads on two cores run the router's c32 load at
200 req/s against 134 with one; with one CPU-bound neighbour process on one core, the same two
threads fall to 85 req/s (6% of requests past the 500 ms deadline) while one thread holds 141,
because the thread that shares a core with the neighbour is descheduled mid-region. libgomp's
knobs do not fix it (OMP_WAIT_POLICY=PASSIVE: 166 alone / 125 contended; ACTIVE: 194 / 98;
GOMP_SPINCOUNT=10000: 194 / 79; `python -m bench.contention_bench`). So the count is measured:
each candidate keeps a smoothed cost per token, the cheapest runs the batches, and now and then
(0.25 s, doubling to 2 s while the choice holds) one batch re-measures another candidate, so the
choice follows a neighbour that comes and goes. A switch costs ~0.25 us (torch.set_num_threads).
"""

from __future__ import annotations

import time
from typing import Callable


def candidates(max_threads: int) -> list[int]:
    """The counts worth trying: all the CPUs, half of them, one."""
    return sorted({max(1, max_threads), max(1, max_threads // 2), 1}, reverse=True)


class ThreadTuner:
    """Used from the model thread only."""

    def __init__(self, max_threads: int, explore_min_s: float = 0.25, explore_max_s: float = 2.0,
                 overhead_tokens: float = 40.0, clock: Callable[[], float] = time.monotonic):
        self.candidates = candidates(max_threads)
        # A batch costs about (padded tokens + a fixed overhead) x seconds per token; comparing
        # candidates per token keeps batches of different shapes comparable.
        self._overhead = overhead_tokens
        self._per_token: dict[int, float | None] = {c: None for c in self.candidates}
        self._last_seen = {c: -1.0 for c in self.candidates}
        self.current = self.candidates[0]
        # Re-measuring a worse count costs one slow batch, so the interval doubles each time the
        # current count is confirmed (up to explore_max_s: how long a neighbour that left may
        # keep us on fewer threads) and drops back once a switch happens.
        self._clock = clock
        self._explore_min, self._explore_max = explore_min_s, explore_max_s
        self._interval = explore_min_s
        self._next_explore = clock() + explore_min_s
        self._exploring: int | None = None

    def choose(self, padded_tokens: int) -> int:
        if len(self.candidates) == 1:
            return self.candidates[0]
        for c in self.candidates:  # measure every candidate first, most threads first
            if self._per_token[c] is None:
                return c
        if self._clock() >= self._next_explore:
            self._exploring = min((c for c in self.candidates if c != self.current), key=lambda c: self._last_seen[c])
            return self._exploring
        return self.current

    def record(self, threads: int, padded_tokens: int, seconds: float) -> None:
        if threads not in self._per_token:
            return
        now = self._clock()
        per_token = seconds / (padded_tokens + self._overhead)
        old = self._per_token[threads]
        # The current count is measured every batch and smoothed; an explored one was last seen
        # long ago, so its new figure mostly replaces the stale one.
        alpha = 0.7 if threads == self._exploring else 0.3
        self._per_token[threads] = per_token if old is None else old + alpha * (per_token - old)
        self._last_seen[threads] = now
        if any(v is None for v in self._per_token.values()):
            return
        best = min(self.candidates, key=lambda c: self._per_token[c])
        if best != self.current and self._per_token[best] < 0.9 * self._per_token[self.current]:
            self.current = best  # a clear edge only: a small one is noise
            self._interval = self._explore_min
        elif threads == self._exploring:
            self._interval = min(2 * self._interval, self._explore_max)
        if threads == self._exploring or now >= self._next_explore:
            self._exploring = None
            self._next_explore = now + self._interval
