"""Config reload: reads the file again on SIGHUP or when it changes, decides what a running process
may take from it, and hands that to the server; an invalid file leaves the old config serving."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from pathlib import Path
from typing import Awaitable, Callable

from esr_app import metrics
from esr_config import RouterConfig, load_config

log = logging.getLogger(__name__)

# Sections a running process cannot swap: they shape the model and the sockets. Of the cache only
# its store is (CacheConfig.reloaded): its matching policy names routes, and swaps with them.
RESTART_ONLY = ("encoder", "batching", "server", "cache", "records", "tracing")


def _running_part(config: RouterConfig, name: str, like: RouterConfig):
    """What of section `name` a running process keeps: all of it, or of the cache all but what
    `like` says of its matching policy."""
    section = getattr(config, name)
    return section.reloaded(like.cache) if name == "cache" else section


class ConfigReloader:
    """`apply(new, swap_model)` puts a config in service; `can_swap_model` says whether this process
    may load a new encoder itself (not behind a model process)."""

    def __init__(self, path: Path, running: RouterConfig, apply: Callable[[RouterConfig, bool], Awaitable[None]],
                 can_swap_model: bool, from_file: RouterConfig | None = None):
        self.path = path
        self._apply = apply
        self._can_swap_model = can_swap_model
        self._running = running
        self._lock = asyncio.Lock()
        # What the file said at start (CLI flags may override server.*): a reload warns against this.
        self._from_file = from_file if from_file is not None else load_config(path)

    async def reload(self, why: str) -> bool:
        """Swap in the file's current routes (and a new encoder this process can load itself)."""
        async with self._lock:
            try:
                from_file = load_config(self.path)
                swap = (self._can_swap_model and from_file.encoder != self._from_file.encoder
                        and from_file.encoder.socket is None)
                frozen = [n for n in RESTART_ONLY
                          if _running_part(from_file, n, from_file) != _running_part(self._from_file, n, from_file)
                          and not (n == "encoder" and swap)]
                if frozen:
                    log.warning("config sections changed that need a restart; keeping their running values",
                                extra={"sections": frozen})
                kept = {n: _running_part(self._running, n, from_file) for n in RESTART_ONLY}
                if swap:
                    kept["encoder"] = from_file.encoder
                new = dataclasses.replace(from_file, **kept)
                await self._apply(new, swap)
                self._running, self._from_file = new, from_file
            except Exception as exc:
                metrics.CONFIG_RELOADS.labels("error").inc()
                log.error("config reload rejected; the previous config keeps serving",
                          extra={"trigger": why, "error": str(exc)[:500]})
                return False
            metrics.CONFIG_RELOADS.labels("ok").inc()
            log.info("config reloaded", extra={"trigger": why, "routes": len(new.routes)})
            return True

    async def watch(self, interval: float) -> None:
        """Reloads whenever the file changes (checked every `interval` seconds), until cancelled."""
        def signature():
            try:
                st = os.stat(self.path)  # follows symlinks: Kubernetes ConfigMap updates swap one
                return (st.st_mtime_ns, st.st_size, st.st_ino)
            except OSError:
                return None

        seen = signature()
        while True:
            await asyncio.sleep(interval)
            now = signature()
            if now is not None and now != seen:
                seen = now
                await self.reload("file_changed")
