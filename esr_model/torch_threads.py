"""Keeps multi-threaded torch work on one thread per process (the batcher's model thread).

Why: torch's CPU kernels run on libgomp, which gives every thread that opens a parallel region
its own pool of workers, kept until that thread exits. Once the process holds more pool threads
than CPUs, libgomp stops spinning between regions and parks its workers on a futex, so each of
the parallel regions in one forward pass pays a wake-up (docs/notes/benchmarks-history.md, measures what a
second pool costs a one-prompt batch). So model loading runs single-threaded, other torch work
(training a head at load) runs on a thread that exits when done, and only the model thread (or
offline CLI work, which has no model thread) keeps a pool.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


@contextmanager
def single_threaded() -> Iterator[None]:
    """torch runs on the calling thread alone inside the block (no libgomp pool is created)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        # Only this thread's setting and the default for threads torch has not seen yet change.
        torch.set_num_threads(before)


async def on_own_thread(fn: Callable[..., T], *args) -> T:
    """Await fn(*args) run on a new thread that exits right after, taking any torch pool with it."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-once")
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
    finally:
        pool.shutdown(wait=False)  # the thread exits once fn returns, even if we stopped waiting
