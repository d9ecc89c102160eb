"""How many torch threads the model thread uses, chosen batch by batch from what batches cost.

Why not a fixed number: a forward pass is many parallel regions, and each waits at its barrier for
its slowest thread. Alone, more threads are faster; beside a CPU-bound neighbour process, the thread
that shares a core with it is descheduled mid-region and every region waits for it, so fewer threads
are faster, and libgomp's wait-policy knobs do not change that (docs/notes/benchmarks-history.md;
`python -m bench.overload.contention_bench`). So the count is measured: the current count's batch cost is
learned from every batch, and now and then (0.25 s, doubling to 2 s while the choice holds) one
batch runs with another count and is compared with what the current count would have taken for it;
a clear win switches. The choice follows a neighbour that comes and goes; a switch is one
torch.set_num_threads call.
"""

from __future__ import annotations

import time
from typing import Callable

from batching.cost_model import BatchCostModel


def model_cpus(budget_cpus: int, front_end_cpus: int = 0) -> int:
    """The CPUs the model's threads may use: the process's budget less those kept for a front end
    that works beside the model on every request (the static tier decides most requests on the
    event loop: on 2 cores, one model thread gave the cascade 1.13x the routed req/s at 0.87x
    the CPU per request of the tuner's choice, docs/notes/static-tier-history.md), never fewer than one."""
    return max(1, budget_cpus - front_end_cpus)


def candidates(max_threads: int) -> list[int]:
    """The counts worth trying: all the CPUs, half of them, one."""
    return sorted({max(1, max_threads), max(1, max_threads // 2), 1}, reverse=True)


class ThreadTuner:
    """Used from the model thread only."""

    def __init__(self, max_threads: int, explore_min_s: float = 0.25, explore_max_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.candidates = candidates(max_threads)
        self.current = self.candidates[0]
        # Comparisons are paired: a batch run with another count is timed against what the
        # current count is predicted to take for that same batch shape. (Comparing each count's
        # own average cost per token is biased: fewer threads let requests pile up into bigger
        # batches, which look cheaper per token, so that version kept choosing too few.)
        self._cost = BatchCostModel(forget=0.9)  # of the current count, from every batch it runs
        # A clear win (under 0.7x) switches at once; a marginal one (0.7-0.9x) is confirmed by a
        # second batch right away (one batch can be unlucky either way). Older measurements are
        # not kept: they describe another moment.
        self._first_win: tuple[int, float] | None = None  # (count, its time / current's)
        self._last_explored = {c: -1.0 for c in self.candidates}
        # Re-measuring a worse count costs one slow batch, so the interval doubles each time the
        # current count is confirmed (up to explore_max_s: how long a neighbour that left may
        # keep us on fewer threads) and drops back after a switch.
        self._clock = clock
        self._explore_min, self._explore_max = explore_min_s, explore_max_s
        self._interval = explore_min_s
        self._next_explore = clock() + explore_min_s
        self._exploring: int | None = None

    def choose(self) -> int:
        """The count to run the next batch with."""
        if len(self.candidates) > 1 and self._cost.ready and self._clock() >= self._next_explore:
            others = [c for c in self.candidates if c != self.current]
            pending = self._first_win[0] if self._first_win else None
            self._exploring = pending or min(others, key=lambda c: self._last_explored[c])
            return self._exploring
        return self.current

    def record(self, threads: int, padded_tokens: int, seconds: float) -> None:
        if threads != self._exploring:
            if threads == self.current:
                # Far slower than this count's own record: something changed (a neighbour
                # arrived): look at the others now rather than at the next scheduled look.
                if self._cost.ready and seconds > 1.5 * self._cost.predict(padded_tokens):
                    self._next_explore = min(self._next_explore, self._clock())
                    self._interval = self._explore_min
                self._cost.observe(padded_tokens, seconds)
            return
        now = self._clock()
        self._exploring = None
        self._last_explored[threads] = now
        predicted = self._cost.predict(padded_tokens)
        if predicted <= 0:
            return
        ratio = seconds / predicted
        if 0.7 <= ratio < 0.9 and self._first_win is None:
            self._first_win = (threads, ratio)
            self._next_explore = now  # confirm with the next batch
            return
        confirmed = ratio if self._first_win is None else (ratio + self._first_win[1]) / 2
        self._first_win = None
        if confirmed < 0.9:  # a clear edge only: a small one is noise
            self.current = threads
            self._cost = BatchCostModel(forget=0.9)
            self._interval = self._explore_min
        else:
            self._interval = min(2 * self._interval, self._explore_max)
        self._next_explore = now + self._interval
