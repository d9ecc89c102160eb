"""Background watches of the router process itself: event-loop lag, tasks and threads alive."""

from __future__ import annotations

import asyncio
import os
import threading

from esr_app import metrics


async def update_process_gauges(process: str, interval: float = 1.0) -> None:
    cpu = metrics.PROCESS_CPU.labels(process)
    while True:
        metrics.LOOP_TASKS.set(len(asyncio.all_tasks()))
        metrics.THREADS.set(threading.active_count())
        times = os.times()
        cpu.set(times.user + times.system)
        await asyncio.sleep(interval)


async def watch_loop_lag(process: str, tick: float = 0.05, window_s: float = 10.0) -> None:
    """A saturated loop delays every stream before the batcher can see it: measure it."""
    loop = asyncio.get_running_loop()
    lag_max = metrics.LOOP_LAG_MAX.labels(process)
    worst, window_start = 0.0, loop.time()
    while True:
        before = loop.time()
        await asyncio.sleep(tick)
        lag = max(0.0, loop.time() - before - tick)
        metrics.LOOP_LAG.observe(lag)
        if before - window_start > window_s:
            worst, window_start = 0.0, before
        worst = max(worst, lag)
        lag_max.set(worst)
