"""The router process and its composition root: builds every piece in order (config -> embedder
(the model and its batcher here, or a client of a model process) -> engine -> filter chain ->
gRPC service), serves what a reload hands it (esr_app.reload), drains on SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import signal
from pathlib import Path
from typing import Callable


import grpc
from envoy.service.accesslog.v3 import als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server
from wsgiref.simple_server import WSGIServer

from esr_app import process_watch
from esr_app.lifecycle import serve_until_signal
from esr_app.embedding import BackendFactory, front_end_tokens, start_batcher
from esr_app.reload import ConfigReloader
from esr_app.routing_build import build_serving
from esr_cache.cache import ResponseCache
from batching import Backend, Embedder
from esr_extproc.attempt_log import FailedAttempts
from esr_extproc.records import DecisionRecorder
from esr_extproc.tracing import Tracing
from esr_extproc.feedback_answer import shared_score
from esr_extproc.service import ExtProcService
from esr_extproc.serving import Serving
from esr_extproc.keeper import CacheKeeper
from filters.chain import FilterChain
from esr_modelsock.client import ModelClient
from esr_app import metrics
from esr_config import RouterConfig
from router.engine import RoutingEngine

log = logging.getLogger(__name__)

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


class PortInUse(RuntimeError):
    """The gRPC port is taken (another router?): refusing to share it."""


def encoder_identity(config: RouterConfig) -> str:
    """Which encoder's vectors the semantic cache compares (its `encoder:` section)."""
    return hashlib.sha256(repr(config.encoder).encode()).hexdigest()[:16]


class RouterServer:
    """Owns every long-lived piece; `engine` is swapped whole on reload."""

    def __init__(
        self,
        config: RouterConfig,
        config_path: Path | None = None,
        backend_factory: BackendFactory | None = None,
        pool_worker: int | None = None,
        file_config: RouterConfig | None = None,
    ):
        # backend_factory: what to run instead of what config.encoder names (fault-injection
        # tests); None: esr_app.embedding.make_backend.
        # pool_worker: this process's index among the workers that share grpc_port (esr_app.pool);
        # the pool then serves /metrics for all of them.
        # file_config: what config_path said, before command-line overrides (None: read it again).
        self._backend_factory = backend_factory
        self.pool_worker = pool_worker
        self.config = config
        self.backend: Backend | None = None
        self.embedder: Embedder | None = None
        self.health = health.aio.HealthServicer()
        self.process = "router" if pool_worker is None else f"worker-{pool_worker}"
        self.tracing = Tracing(config.tracing, self.process) if config.tracing.enabled else None
        self.ext_proc = ExtProcService(self.process, ResponseCache(config.cache) if config.cache.enabled else None,
                                       DecisionRecorder(config.records) if config.records.enabled else None,
                                       self.tracing)
        self.grpc: grpc.aio.Server | None = None
        self.grpc_port = 0
        self.health_grpc: grpc.aio.Server | None = None  # server.health_port's
        self.health_port = 0
        self.metrics_port = 0
        self._metrics_http: WSGIServer | None = None
        self._version: str | None = None  # of the config serving now, exported per process
        self._stopping = False
        self._tasks: set[asyncio.Task] = set()  # held until done: the loop keeps only weak references
        self.reloader = (ConfigReloader(config_path, config, self._apply,
                                        can_swap_model=config.encoder.socket is None and pool_worker is None,
                                        from_file=file_config)
                         if config_path is not None else None)

    @property
    def engine(self) -> RoutingEngine | None:
        return self.ext_proc.engine

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def start(self) -> None:
        cfg = self.config.server
        if self.pool_worker is None:
            metrics_http, _ = start_http_server(cfg.metrics_port, addr=cfg.metrics_host)
            self._metrics_http, self.metrics_port = metrics_http, metrics_http.server_port
        # SO_REUSEPORT (gRPC's default) would let a second router bind the same port silently and
        # take a share of Envoy's connections: only a pool's own workers share it (the pool has
        # checked that the port was free).
        self.grpc = server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024),
                                                      ("grpc.so_reuseport", int(self.pool_worker is not None))])
        try:
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
            ext_proc_grpc.add_ExternalProcessorServicer_to_server(self.ext_proc, self.grpc)
            als_pb2_grpc.add_AccessLogServiceServicer_to_server(FailedAttempts(), self.grpc)  # Envoy's failed tries
            if self.ext_proc.cache is not None:  # answers Envoy's keeper hands back (esr_extproc/keeper.py)
                self.grpc.add_generic_rpc_handlers((CacheKeeper(self.ext_proc.cache).handler(),))
            FilterChain.from_config(self.config.filters, self.config.filter_settings)  # a bad chain fails before the model loads
            self.ext_proc.start()  # its worker process starts while the model loads
            if self.ext_proc.cache is not None:
                self.ext_proc.cache.use_encoder(encoder_identity(self.config))  # before the shared index is read
                self.ext_proc.cache.start()
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            # Alone, the router listens at once (health checks see it loading; requests pass unrouted).
            # A pool's worker listens only once it can route: while it starts, its siblings take the
            # connections the kernel would otherwise hand it.
            if self.pool_worker is None:
                await self._listen(server)
            self.embedder = await self._start_embedder()
            # torch, transformers and the model leave hundreds of thousands of long-lived objects: every
            # full collection walked them all holding the GIL (which the model thread needs between
            # ops), a latency spike every few seconds of traffic. Frozen, they are never scanned again. Frozen before the engine is built, so a reload's old engine stays collectable.
            gc.collect()
            gc.freeze()
            self._activate(self.config, await build_serving(self.config, self.embedder, None))
            await self._set_health(self._serving_status())
            if self.pool_worker is not None:
                await self._listen(server)
            if self.reloader is not None and self.config.server.watch_config_s > 0:
                self._spawn(self.reloader.watch(self.config.server.watch_config_s))
            self._spawn(process_watch.update_process_gauges(self.process))
            self._spawn(process_watch.watch_loop_lag(self.process))
            log.info(
                "router serving",
                extra={"grpc_port": self.grpc_port, "metrics_port": self.metrics_port,
                       "device": getattr(self.backend, "device", "n/a"),
                       "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0]},
            )
        except BaseException:
            # a start that fails (a config error found as the model loads) leaves no listener, worker
            # or metrics port behind, and no gRPC server for a closed event loop to complain about
            await self._close(grace=0)
            raise

    async def _listen(self, server: grpc.aio.Server) -> None:
        cfg = self.config.server
        try:
            self.grpc_port = server.add_insecure_port(f"{cfg.grpc_host}:{cfg.grpc_port}")
        except RuntimeError as exc:
            raise PortInUse(f"grpc port {cfg.grpc_port} is already in use on {cfg.grpc_host} "
                            "(another router running?)") from exc
        if cfg.health_port is not None:
            # grpc.health.v1 alone on a port of its own too (the Inference Extension's layout): the
            # same servicer, so both ports say the same.
            self.health_grpc = grpc.aio.server(options=[("grpc.so_reuseport", int(self.pool_worker is not None))])
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.health_grpc)
            try:
                self.health_port = self.health_grpc.add_insecure_port(f"{cfg.grpc_host}:{cfg.health_port}")
            except RuntimeError as exc:
                raise PortInUse(f"health port {cfg.health_port} is already in use on {cfg.grpc_host}") from exc
            await self.health_grpc.start()
        await server.start()

    async def _start_embedder(self) -> Embedder:
        """A client of the model process at encoder.socket, or the model (or remote engine) and its
        batcher here."""
        if self.config.encoder.socket is not None:
            client = ModelClient(self.config.encoder.socket, on_state=self._on_model_state,
                                 on_score=self._on_shared_score, token_ids=front_end_tokens(self.config))
            client.call_span = self.tracing.span if self.tracing is not None else None
            client.start(asyncio.get_running_loop())
            await client.started()
            return client
        batcher = await start_batcher(self.config, self._backend_factory, self._batch_hook())
        self.backend = batcher.backend
        return batcher

    def _batch_hook(self):
        """What traces this process's batches (the model process's, behind a socket, are not)."""
        return self.tracing.batch_hook if self.tracing is not None else None

    def _on_shared_score(self, selection_id: str, score: float) -> None:
        engine = self.ext_proc.engine
        if engine is not None and engine.feedback is not None:
            shared_score(engine.feedback, selection_id, score)

    def _serving_status(self):
        model_away = isinstance(self.embedder, ModelClient) and not self.embedder.connected
        if self.ext_proc.serving is None or model_away:
            return health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse.SERVING

    def _on_model_state(self, up: bool) -> None:
        # While the model process is away requests fall back (ModelUnavailable): still answered,
        # but not routed, so the health checks say so.
        if self.ext_proc.serving is not None and not self._stopping:
            self._spawn(self._set_health(self._serving_status()))

    def _activate(self, config: RouterConfig, serving: Serving) -> None:
        # Not a coroutine: the swap is atomic for every request on the event loop.
        self.config = config
        if self.ext_proc.cache is not None:
            self.ext_proc.cache.use_encoder(encoder_identity(config))
        feedback = serving.engine.feedback
        if feedback is not None and isinstance(self.embedder, ModelClient):  # a pool's worker
            feedback.claim = self.embedder.claim_score
        self.ext_proc.serve(serving)
        version = config_version(config)
        if self._version is not None and self._version != version:
            metrics.CONFIG_VERSION.labels(self.process, self._version).set(0)
        metrics.CONFIG_VERSION.labels(self.process, version).set(1)
        self._version = version

    async def reload(self, why: str) -> bool:
        """Swap in the config file's current routes; an invalid file leaves the old ones serving."""
        if self.reloader is None:  # built from a config object (tests, an embedding program)
            log.warning("config reload asked for, but the router was not started from a file", extra={"trigger": why})
            return False
        return await self.reloader.reload(why)

    async def _apply(self, new: RouterConfig, swap_model: bool) -> None:
        """Serves `new` (from a reload): on a new encoder when `swap_model`, else on the running one."""
        if swap_model:
            await self._swap_model(new)
        else:
            assert self.embedder is not None  # reloads run once start() has made it
            self._activate(new, await build_serving(new, self.embedder, self.ext_proc.engine))

    async def _swap_model(self, new: RouterConfig) -> None:
        """Loads `new`'s encoder in a batcher of its own beside the running one (memory for two models
        meanwhile), builds the routes on it, swaps engine and batcher in one step, then drains the
        old batcher: requests already on the old engine finish on the old model."""
        embedder = await start_batcher(new, self._backend_factory, self._batch_hook())
        try:
            serving = await build_serving(new, embedder, None)
        except BaseException:
            await embedder.aclose(0)
            raise
        old = self.embedder
        assert old is not None  # reloads run once start() has made it
        self.embedder, self.backend = embedder, embedder.backend
        self._activate(new, serving)
        log.info("encoder swapped", extra={"model": new.encoder.model, "device": getattr(self.backend, "device", "n/a")})
        self._spawn(old.aclose(new.server.shutdown_grace_s))

    async def _set_health(self, status) -> None:
        if status == health_pb2.HealthCheckResponse.SERVING and self.ext_proc.serving is None:
            raise RuntimeError("refusing to report SERVING: the ext_proc service has no engine")
        for name in ("", EXT_PROC_SERVICE):
            await self.health.set(name, status)

    async def stop(self) -> None:
        """NOT_SERVING first, keep serving for shutdown_delay_s while that propagates (readiness
        probes, health-checking peers), then refuse new streams, finish in-flight ones, drain."""
        self._stopping = True
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        for task in list(self._tasks):
            task.cancel()  # the reloader and gauges stop at once; the listener goes after the delay
        await asyncio.sleep(self.config.server.shutdown_delay_s)
        await self._close(self.config.server.shutdown_grace_s)
        log.info("router stopped")

    async def _close(self, grace: float) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.grpc is not None:
            await self.grpc.stop(grace)
        if self.health_grpc is not None:
            await self.health_grpc.stop(0)
        if self.embedder is not None:
            await self.embedder.aclose(grace)
        self.ext_proc.close()
        if self.tracing is not None:
            self.tracing.shutdown()  # what is still buffered goes out
        if self.ext_proc.cache is not None:
            await self.ext_proc.cache.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()

    def on_sighup(self) -> asyncio.Task:
        return self._spawn(self.reload("sighup"))

    async def run_until_signal(self, on_ready: Callable[[], None] | None = None,
                               signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        await serve_until_signal(self, lambda: f"router ready grpc={self.grpc_port} metrics={self.metrics_port}",
                                 on_ready, signals, on_hup=self.on_sighup)


def config_version(config: RouterConfig) -> str:
    """A short hash of the config a process serves: every pool worker should export the same."""
    return hashlib.sha256(repr(config).encode()).hexdigest()[:12]
