"""Runs one of the router's processes (a router, a pool worker, the model process) from start to
a stop signal."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Callable, Protocol

log = logging.getLogger(__name__)


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def serve_until_signal(
    service: Service,
    ready_line: Callable[[], str],
    on_ready: Callable[[], None] | None = None,
    signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
    on_hup: Callable[[], object] | None = None,
) -> None:
    """Starts `service`, announces it (`on_ready`, else `ready_line()` on stdout: what launchers
    wait for), stops it on the first of `signals`; SIGHUP calls `on_hup` once started."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    if on_hup is not None:
        loop.add_signal_handler(signal.SIGHUP, on_hup)
    if on_ready is not None:
        on_ready()
    else:
        print(ready_line(), flush=True)
    await stop.wait()
    log.info("shutdown requested")
    await service.stop()
