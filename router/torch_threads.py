"""Keeps multi-threaded torch work on one thread per process (the batcher's model thread).

Why: torch's CPU kernels run on libgomp, which gives every thread that opens a parallel region
its own pool of workers, kept until that thread exits. Once the process holds more pool threads
than CPUs, libgomp stops spinning between regions and parks its workers on a futex, so each of
the ~40 parallel regions in one forward pass pays a wake-up. Measured on the 2-core CI machine
(README, "Benchmarks"): a model thread ran a one-prompt batch in 10.2 ms with a second pool alive
in the process and 8.0 ms without it. Model loading and head training therefore run
single-threaded; only the model thread (and offline CLI work, which has no model thread) uses
the configured thread count.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


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
