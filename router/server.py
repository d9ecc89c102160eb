"""The router process: loads the model, starts the batcher, the gRPC server and /metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import os
import signal
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path
from typing import Awaitable, Callable, Sequence

import numpy as np

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from batching import Backend, BatcherSettings, ContinuousBatcher
from router.classifier import RouteClassifier
from router import metrics
from router.config import RouterConfig, load_config
from router.encoder import SentenceEncoder
from router.engine import RoutingEngine
from router.metrics import PrometheusBatchObserver
from router.torch_threads import on_own_thread

log = logging.getLogger(__name__)

# Services (the ext_proc servicer among them) plug in here, so the router never imports filters.
SERVICE_GROUP = "semantic_router.services"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Sections a running process cannot swap: they shape the model and the sockets.
RESTART_ONLY = ("encoder", "batching", "server")

# A service's hook, given each new engine before it serves; returns the step that makes the
# service's own matching state live (run together with the engine swap, never half-way).
EngineHook = Callable[[RoutingEngine], Awaitable[Callable[[], None]]]


class PortInUse(RuntimeError):
    """The gRPC port is taken (another router?): refusing to share it."""


def batcher_settings(config: RouterConfig) -> BatcherSettings:
    b = config.batching
    return BatcherSettings(
        max_batch_size=b.max_batch_size,
        max_batch_tokens=b.max_batch_tokens,
        max_queue_requests=b.max_queue_requests,
        max_queue_tokens=b.max_queue_tokens,
        window=b.sort_window,
        max_padding=b.max_padding,
        max_wait_s=b.max_wait_ms / 1000.0,
    )


class RouterServer:
    """Owns every long-lived piece; `engine` is swapped whole on reload."""

    def __init__(
        self,
        config: RouterConfig,
        config_path: Path | None = None,
        backend_factory: Callable[[RouterConfig], Backend] | None = None,
    ):
        # backend_factory: what to run instead of the configured sentence-transformers model
        # (fault-injection tests); None loads config.encoder.
        self._backend_factory = backend_factory or (lambda cfg: SentenceEncoder(cfg.encoder))
        self.config = config
        self.config_path = config_path
        self.engine: RoutingEngine | None = None
        self.backend: Backend | None = None
        self.batcher: ContinuousBatcher | None = None
        self.health = health.aio.HealthServicer()
        self.grpc: grpc.aio.Server | None = None
        self.grpc_port = 0
        self.metrics_port = 0
        self._metrics_http = None
        self._engine_hooks: list[EngineHook] = []
        self._reload_lock = asyncio.Lock()
        self._watch_task: asyncio.Task | None = None
        self._gauge_task: asyncio.Task | None = None
        self._lag_task: asyncio.Task | None = None
        # What the file said at start (CLI flags may override server.*): reload warns against this.
        self._file_config = load_config(config_path) if config_path is not None else config

    def on_engine(self, hook: EngineHook) -> None:
        self._engine_hooks.append(hook)

    async def start(self) -> None:
        cfg = self.config.server
        self._metrics_http, _ = start_http_server(cfg.metrics_port, addr=cfg.metrics_host)
        self.metrics_port = self._metrics_http.server_port
        # SO_REUSEPORT (gRPC's default) would let a second router bind the same port silently and
        # take a share of Envoy's connections.
        self.grpc = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024),
                                             ("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        for ep in entry_points(group=SERVICE_GROUP):
            ep.load()(self.grpc, self)
        try:
            self.grpc_port = self.grpc.add_insecure_port(f"{cfg.grpc_host}:{cfg.grpc_port}")
        except RuntimeError as exc:
            self._metrics_http.shutdown()
            raise PortInUse(f"grpc port {cfg.grpc_port} is already in use on {cfg.grpc_host} "
                            "(another router running?)") from exc
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.grpc.start()
        loop = asyncio.get_running_loop()
        # Model load and warm-up block for seconds: keep the loop (health checks) answering.
        self.backend = await loop.run_in_executor(None, self._backend_factory, self.config)
        self.batcher = ContinuousBatcher(self.backend, batcher_settings(self.config), PrometheusBatchObserver())
        self.batcher.start(loop)
        await self.batcher.started()  # warm-up runs on the model thread
        # torch, transformers and the model leave ~440k long-lived objects: every full collection
        # walked them all holding the GIL for ~190 ms (measured; the model thread needs the GIL
        # between ops), a latency spike every few seconds of traffic. Frozen, they are never
        # scanned again. Frozen before the engine is built, so a reload's old engine stays collectable.
        gc.collect()
        gc.freeze()
        await self._activate(self.config, await self._build_engine(self.config))
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        if self.config_path is not None and self.config.server.watch_config_s > 0:
            self._watch_task = asyncio.create_task(self._watch_config(self.config.server.watch_config_s))
        self._gauge_task = asyncio.create_task(self._update_process_gauges())
        self._lag_task = asyncio.create_task(self._watch_loop_lag())
        log.info(
            "router serving",
            extra={"grpc_port": self.grpc_port, "metrics_port": self.metrics_port,
                   "device": getattr(self.backend, "device", "n/a")},
        )

    async def _build_engine(self, config: RouterConfig) -> RoutingEngine:
        """Utterances are embedded through the batcher: only its model thread touches the model."""
        texts = sorted({u for r in config.routes for u in r.utterances} | set(config.default_route.utterances))
        deadline = time.monotonic() + 300.0
        vectors: list[np.ndarray] = []
        step = max(1, config.batching.max_queue_requests // 2)
        for i in range(0, len(texts), step):
            vectors += await asyncio.gather(*(self.batcher.embed(t, deadline) for t in texts[i : i + step]))
        lookup = dict(zip(texts, vectors))

        def encode(batch: Sequence[str]) -> np.ndarray:
            return np.stack([lookup[t] for t in batch])

        # A head trained at load (no head_path) is seconds of torch work: off the event loop, on a
        # thread that then exits, so that only the model thread keeps a torch pool (torch_threads).
        classifier = await on_own_thread(RouteClassifier, config, encode)
        return RoutingEngine(config, self.batcher, classifier)

    async def _activate(self, config: RouterConfig, engine: RoutingEngine) -> None:
        commits = [await hook(engine) for hook in self._engine_hooks]
        # No await from here on: the swap is atomic for every request on the event loop.
        self.config, self.engine = config, engine
        for commit in commits:
            commit()

    async def reload(self, why: str) -> bool:
        """Swap in the config file's current routes; an invalid file leaves the old ones serving."""
        async with self._reload_lock:
            try:
                from_file = load_config(self.config_path)
                frozen = [n for n in RESTART_ONLY if getattr(from_file, n) != getattr(self._file_config, n)]
                if frozen:
                    log.warning("config sections changed that need a restart; keeping their running values",
                                extra={"sections": frozen})
                new = dataclasses.replace(from_file, **{n: getattr(self.config, n) for n in RESTART_ONLY})
                await self._activate(new, await self._build_engine(new))
                self._file_config = from_file
            except Exception as exc:
                metrics.CONFIG_RELOADS.labels("error").inc()
                log.error("config reload rejected; the previous config keeps serving",
                          extra={"trigger": why, "error": str(exc)[:500]})
                return False
            metrics.CONFIG_RELOADS.labels("ok").inc()
            log.info("config reloaded", extra={"trigger": why, "routes": len(new.routes)})
            return True

    async def _watch_config(self, interval: float) -> None:
        def signature():
            try:
                st = os.stat(self.config_path)  # follows symlinks: Kubernetes ConfigMap updates swap one
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

    async def _update_process_gauges(self) -> None:
        while True:
            metrics.LOOP_TASKS.set(len(asyncio.all_tasks()))
            metrics.THREADS.set(threading.active_count())
            await asyncio.sleep(1.0)

    async def _watch_loop_lag(self, tick: float = 0.05, window_s: float = 10.0) -> None:
        """A saturated loop delays every stream before the batcher can see it: measure it."""
        loop = asyncio.get_running_loop()
        worst, window_start = 0.0, loop.time()
        while True:
            before = loop.time()
            await asyncio.sleep(tick)
            lag = max(0.0, loop.time() - before - tick)
            metrics.LOOP_LAG.observe(lag)
            if before - window_start > window_s:
                worst, window_start = 0.0, before
            worst = max(worst, lag)
            metrics.LOOP_LAG_MAX.set(worst)

    async def _set_health(self, status) -> None:
        for name in ("", EXT_PROC_SERVICE):
            await self.health.set(name, status)

    async def stop(self) -> None:
        """NOT_SERVING first, keep serving for shutdown_delay_s while that propagates (readiness
        probes, health-checking peers), then refuse new streams, finish in-flight ones, drain."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        for task in (self._watch_task, self._gauge_task, self._lag_task):
            if task is not None:
                task.cancel()
        await asyncio.sleep(self.config.server.shutdown_delay_s)
        grace = self.config.server.shutdown_grace_s
        if self.grpc is not None:
            await self.grpc.stop(grace)
        if self.batcher is not None:
            await self.batcher.aclose(grace)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        log.info("router stopped")

    async def run_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload("sighup")))
        print(f"router ready grpc={self.grpc_port} metrics={self.metrics_port}", flush=True)
        await stop.wait()
        log.info("shutdown requested")
        await self.stop()
