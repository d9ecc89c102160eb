"""The model process: owns the model and the one continuous batcher, and serves embeddings on a
Unix socket to every front end that connects (a pool's workers, or routers in other pods of the
node through a shared volume)."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import signal
import time
from pathlib import Path
from typing import Callable

import numpy as np

from esr_app import process_watch
from esr_app.lifecycle import serve_until_signal
from esr_app.embedding import BackendFactory, start_batcher
from batching import ContinuousBatcher
from esr_modelsock.server import ModelSocketServer
from esr_config import RouterConfig

log = logging.getLogger(__name__)


class ModelProcess:
    def __init__(self, config: RouterConfig, socket_path: str | Path,
                 backend_factory: BackendFactory | None = None):
        self.config = config
        self.socket_path = Path(socket_path)
        self._backend_factory = backend_factory
        self.batcher: ContinuousBatcher | None = None
        self.server: ModelSocketServer | None = None
        self._watches: list[asyncio.Task] = []

    async def start(self) -> None:
        self.batcher = await start_batcher(self.config, self._backend_factory)
        backend = self.batcher.backend
        gc.collect()
        gc.freeze()  # see RouterServer.start: the model's objects are never scanned again
        remote = self.config.encoder.remote
        info = {"model": remote.model if remote else self.config.encoder.model,
                "dimension": getattr(backend, "dimension", None), "device": getattr(backend, "device", "n/a"),
                "fingerprint": await fingerprint(self.batcher)}
        if hasattr(backend, "token_spec") and hasattr(backend, "read_ids"):  # a local model: front ends may tokenize
            info["tokens"] = backend.token_spec()
        self.server = ModelSocketServer(self.batcher, self.socket_path, info)
        await self.server.start()
        self._watches = [asyncio.create_task(process_watch.update_process_gauges("model")),
                         asyncio.create_task(process_watch.watch_loop_lag("model"))]

    async def stop(self) -> None:
        """Refuses new front ends, then answers what is queued."""
        for task in self._watches:
            task.cancel()
        if self.server is not None:
            await self.server.close()
        if self.batcher is not None:
            await self.batcher.aclose(self.config.server.shutdown_grace_s)
        log.info("model process stopped")

    async def run_until_signal(self, on_ready: Callable[[], None] | None = None,
                               signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        await serve_until_signal(self, lambda: f"model ready socket={self.socket_path}", on_ready, signals)


FINGERPRINT_TEXT = "semantic-router model fingerprint: the quick brown fox jumps over the lazy dog"


async def fingerprint(batcher) -> str:
    """Which model this is, by what it does: a hash of its (rounded) embedding of a fixed text. A
    front end that built its routes on one model refuses another (esr_modelsock.client)."""
    vector = await batcher.embed(FINGERPRINT_TEXT, time.monotonic() + 60.0)
    return hashlib.sha256(np.round(np.asarray(vector, dtype=np.float32), 3).tobytes()).hexdigest()[:16]
