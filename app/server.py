"""The router process and its composition root: builds every piece in order (config -> embedder
(the model and its batcher here, or a client of a model process) -> engine -> filter chain ->
gRPC service), swaps the (engine, chain) pair on reload, drains on SIGTERM."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from app import process_watch
from app.lifecycle import serve_until_signal
from app.embedding import BackendFactory, start_batcher
from batching import Backend, DeadlineExceeded, Embedder, Overloaded
from extproc.service import ExtProcService
from filters.chain import FilterChain
from model.torch_threads import on_own_thread
from modelsock.client import ModelClient
from router import metrics
from router.classifier import RouteClassifier
from router.config import RouterConfig, load_config
from router.engine import RoutingEngine

log = logging.getLogger(__name__)

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
# Sections a running process cannot swap: they shape the model and the sockets.
RESTART_ONLY = ("encoder", "batching", "server")


class PortInUse(RuntimeError):
    """The gRPC port is taken (another router?): refusing to share it."""


class RouterServer:
    """Owns every long-lived piece; `engine` is swapped whole on reload."""

    def __init__(
        self,
        config: RouterConfig,
        config_path: Path | None = None,
        backend_factory: BackendFactory | None = None,
        pool_worker: int | None = None,
    ):
        # backend_factory: what to run instead of what config.encoder names (fault-injection
        # tests); None: app.embedding.make_backend.
        # pool_worker: this process's index among the workers that share grpc_port (app.pool);
        # the pool then serves /metrics for all of them.
        self._backend_factory = backend_factory
        self.pool_worker = pool_worker
        self.config = config
        self.config_path = config_path
        self.backend: Backend | None = None
        self.embedder: Embedder | None = None
        self.health = health.aio.HealthServicer()
        self.process = "router" if pool_worker is None else f"worker-{pool_worker}"
        self.ext_proc = ExtProcService(self.process)
        self.grpc: grpc.aio.Server | None = None
        self.grpc_port = 0
        self.metrics_port = 0
        self._metrics_http = None
        self._reload_lock = asyncio.Lock()
        self._version: str | None = None  # of the config serving now, exported per process
        self._stopping = False
        self._tasks: set[asyncio.Task] = set()  # held until done: the loop keeps only weak references
        # What the file said at start (CLI flags may override server.*): reload warns against this.
        self._file_config = load_config(config_path) if config_path is not None else config

    @property
    def engine(self) -> RoutingEngine | None:
        return self.ext_proc.routing[0] if self.ext_proc.routing else None

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self) -> None:
        cfg = self.config.server
        if self.pool_worker is None:
            self._metrics_http, _ = start_http_server(cfg.metrics_port, addr=cfg.metrics_host)
            self.metrics_port = self._metrics_http.server_port
        # SO_REUSEPORT (gRPC's default) would let a second router bind the same port silently and
        # take a share of Envoy's connections: only a pool's own workers share it (the pool has
        # checked that the port was free).
        self.grpc = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024),
                                             ("grpc.so_reuseport", int(self.pool_worker is not None))])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(self.ext_proc, self.grpc)
        FilterChain.from_config(self.config.filters, self.config.filter_settings)  # a bad chain fails before the model loads
        self.ext_proc.start()  # its worker process starts while the model loads
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        # Alone, the router listens at once (health checks see it loading; requests pass unrouted).
        # A pool's worker listens only once it can route: while it starts, its siblings take the
        # connections the kernel would otherwise hand it.
        if self.pool_worker is None:
            await self._listen()
        self.embedder = await self._start_embedder()
        # torch, transformers and the model leave ~440k long-lived objects: every full collection
        # walked them all holding the GIL for ~190 ms (measured; the model thread needs the GIL
        # between ops), a latency spike every few seconds of traffic. Frozen, they are never
        # scanned again. Frozen before the engine is built, so a reload's old engine stays collectable.
        gc.collect()
        gc.freeze()
        self._activate(self.config, *await self._build_routing(self.config))
        await self._set_health(self._serving_status())
        if self.pool_worker is not None:
            await self._listen()
        if self.config_path is not None and self.config.server.watch_config_s > 0:
            self._spawn(self._watch_config(self.config.server.watch_config_s))
        self._spawn(process_watch.update_process_gauges(self.process))
        self._spawn(process_watch.watch_loop_lag(self.process))
        log.info(
            "router serving",
            extra={"grpc_port": self.grpc_port, "metrics_port": self.metrics_port,
                   "device": getattr(self.backend, "device", "n/a"),
                   "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0]},
        )

    async def _listen(self) -> None:
        cfg = self.config.server
        try:
            self.grpc_port = self.grpc.add_insecure_port(f"{cfg.grpc_host}:{cfg.grpc_port}")
        except RuntimeError as exc:
            if self._metrics_http is not None:
                self._metrics_http.shutdown()
            raise PortInUse(f"grpc port {cfg.grpc_port} is already in use on {cfg.grpc_host} "
                            "(another router running?)") from exc
        await self.grpc.start()

    async def _start_embedder(self) -> Embedder:
        """A client of the model process at encoder.socket, or the model (or remote engine) and its
        batcher here."""
        if self.config.encoder.socket is not None:
            client = ModelClient(self.config.encoder.socket, on_state=self._on_model_state)
            client.start(asyncio.get_running_loop())
            await client.started()
            return client
        batcher = await start_batcher(self.config, self._backend_factory)
        self.backend = batcher.backend
        return batcher

    def _serving_status(self):
        model_away = isinstance(self.embedder, ModelClient) and not self.embedder.connected
        if self.ext_proc.routing is None or model_away:
            return health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse.SERVING

    def _on_model_state(self, up: bool) -> None:
        # While the model process is away requests fall back (ModelUnavailable): still answered,
        # but not routed, so the health checks say so.
        if self.ext_proc.routing is not None and not self._stopping:
            self._spawn(self._set_health(self._serving_status()))

    async def _build_routing(self, config: RouterConfig, embedder: Embedder | None = None
                             ) -> tuple[RoutingEngine, FilterChain]:
        """The engine for `config` and its filter chain, set up and ready to serve together, on
        `embedder` (default: the running one). Utterances are embedded through the batcher: only
        its model thread touches the model."""
        embedder = embedder or self.embedder
        texts = sorted({u for r in config.routes for u in r.utterances} | set(config.default_route.utterances))
        # What the serving engine already embedded on this embedder costs nothing again: a reload
        # embeds only new utterances, a few at a time, so live requests are not refused for them.
        current = self.ext_proc.routing
        same_encoder = current is not None and embedder is self.embedder
        known = current[0].utterances if same_encoder else {}
        lookup = {t: known[t] for t in texts if t in known}
        lookup.update(await embed_utterances(embedder, [t for t in texts if t not in lookup],
                                             step=16 if current else max(1, config.batching.max_queue_requests // 2)))

        def encode(batch: Sequence[str]) -> np.ndarray:
            return np.stack([lookup[t] for t in batch])

        # A head trained at load (no head_path) is seconds of torch work: off the event loop, on a
        # thread that then exits, so that only the model thread keeps a torch pool (torch_threads).
        classifier = await on_own_thread(RouteClassifier, config, encode)
        # One cache across reloads on the same encoder: an embedding does not depend on routes.
        engine = RoutingEngine(config, embedder, classifier, current[0].cache if same_encoder else None,
                               utterances=lookup)
        return engine, await FilterChain.for_engine(engine)

    def _activate(self, config: RouterConfig, engine: RoutingEngine, chain: FilterChain) -> None:
        # Not a coroutine: the swap is atomic for every request on the event loop.
        self.config = config
        self.ext_proc.serve(engine, chain)
        version = config_version(config)
        if self._version is not None and self._version != version:
            metrics.CONFIG_VERSION.labels(self.process, self._version).set(0)
        metrics.CONFIG_VERSION.labels(self.process, version).set(1)
        self._version = version

    async def reload(self, why: str) -> bool:
        """Swap in the config file's current routes; an invalid file leaves the old ones serving."""
        async with self._reload_lock:
            try:
                from_file = load_config(self.config_path)
                swap = self._swaps_model(from_file)
                frozen = [n for n in RESTART_ONLY if getattr(from_file, n) != getattr(self._file_config, n)
                          and not (n == "encoder" and swap)]
                if frozen:
                    log.warning("config sections changed that need a restart; keeping their running values",
                                extra={"sections": frozen})
                kept = {n: getattr(self.config, n) for n in RESTART_ONLY}
                if swap:
                    kept["encoder"] = from_file.encoder
                new = dataclasses.replace(from_file, **kept)
                if swap:
                    await self._swap_model(new)
                else:
                    self._activate(new, *await self._build_routing(new))
                self._file_config = from_file
            except Exception as exc:
                metrics.CONFIG_RELOADS.labels("error").inc()
                log.error("config reload rejected; the previous config keeps serving",
                          extra={"trigger": why, "error": str(exc)[:500]})
                return False
            metrics.CONFIG_RELOADS.labels("ok").inc()
            log.info("config reloaded", extra={"trigger": why, "routes": len(new.routes)})
            return True

    def _swaps_model(self, from_file: RouterConfig) -> bool:
        """Whether a reload brings a new encoder this process can load itself (a fine-tuned model,
        say). Behind a model process (encoder.socket, a pool) that process owns the model: restart it."""
        return (from_file.encoder != self._file_config.encoder and self.config.encoder.socket is None
                and from_file.encoder.socket is None and self.pool_worker is None)

    async def _swap_model(self, new: RouterConfig) -> None:
        """Loads `new`'s encoder in a batcher of its own beside the running one (memory for two models
        meanwhile), builds the routes on it, swaps engine and batcher in one step, then drains the
        old batcher: requests already on the old engine finish on the old model."""
        embedder = await start_batcher(new, self._backend_factory)
        try:
            routing = await self._build_routing(new, embedder)
        except BaseException:
            await embedder.aclose(0)
            raise
        old = self.embedder
        self.embedder, self.backend = embedder, embedder.backend
        self._activate(new, *routing)
        log.info("encoder swapped", extra={"model": new.encoder.model, "device": getattr(self.backend, "device", "n/a")})
        self._spawn(old.aclose(new.server.shutdown_grace_s))

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

    async def _set_health(self, status) -> None:
        if status == health_pb2.HealthCheckResponse.SERVING and self.ext_proc.routing is None:
            raise RuntimeError("refusing to report SERVING: the ext_proc service has no engine")
        for name in ("", EXT_PROC_SERVICE):
            await self.health.set(name, status)

    async def stop(self) -> None:
        """NOT_SERVING first, keep serving for shutdown_delay_s while that propagates (readiness
        probes, health-checking peers), then refuse new streams, finish in-flight ones, drain."""
        self._stopping = True
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.sleep(self.config.server.shutdown_delay_s)
        grace = self.config.server.shutdown_grace_s
        if self.grpc is not None:
            await self.grpc.stop(grace)
        if self.embedder is not None:
            await self.embedder.aclose(grace)
        self.ext_proc.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        log.info("router stopped")

    def on_sighup(self) -> asyncio.Task:
        return self._spawn(self.reload("sighup"))

    async def run_until_signal(self, on_ready: Callable[[], None] | None = None,
                               signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        await serve_until_signal(self, lambda: f"router ready grpc={self.grpc_port} metrics={self.metrics_port}",
                                 on_ready, signals, on_hup=self.on_sighup)


def config_version(config: RouterConfig) -> str:
    """A short hash of the config a process serves: every pool worker should export the same."""
    return hashlib.sha256(repr(config).encode()).hexdigest()[:12]


# Refusals that say "not now": a reload waits them out instead of failing (in a pool, a worker whose
# reload failed would serve the old routes while the others serve the new).
_NOT_NOW = (Overloaded, DeadlineExceeded)


async def embed_utterances(embedder: Embedder, texts: Sequence[str], step: int,
                           budget_s: float = 300.0) -> dict[str, np.ndarray]:
    """Embeddings of `texts`, `step` at a time; a step the batcher refuses for overload is tried
    again after a pause (up to `budget_s` in all), so route embedding yields to live traffic."""
    out: dict[str, np.ndarray] = {}
    give_up = time.monotonic() + budget_s
    for i in range(0, len(texts), step):
        chunk, pause = texts[i:i + step], 0.05
        while True:
            try:
                vectors = await asyncio.gather(*(embedder.embed(t, min(give_up, time.monotonic() + 30.0))
                                                 for t in chunk))
                break
            except _NOT_NOW:
                if time.monotonic() + pause > give_up:
                    raise
                await asyncio.sleep(pause)
                pause = min(1.0, pause * 2)
        out.update(zip(chunk, vectors))
    return out
