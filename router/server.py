"""The router process: loads the model, starts the batcher, the gRPC server and /metrics."""

from __future__ import annotations

import asyncio
import logging
import signal
from importlib.metadata import entry_points
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from batching import BatcherSettings, ContinuousBatcher
from router.classifier import RouteClassifier
from router.config import RouterConfig
from router.encoder import SentenceEncoder
from router.engine import RoutingEngine
from router.metrics import PrometheusBatchObserver

log = logging.getLogger(__name__)

# Services (the ext_proc servicer among them) plug in here, so the router never imports filters.
SERVICE_GROUP = "semantic_router.services"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"


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

    def __init__(self, config: RouterConfig, config_path: Path | None = None):
        self.config = config
        self.config_path = config_path
        self.engine: RoutingEngine | None = None
        self.encoder: SentenceEncoder | None = None
        self.batcher: ContinuousBatcher | None = None
        self.health = health.aio.HealthServicer()
        self.grpc: grpc.aio.Server | None = None
        self.grpc_port = 0
        self.metrics_port = 0
        self._metrics_http = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        cfg = self.config.server
        self._metrics_http, _ = start_http_server(cfg.metrics_port, addr=cfg.metrics_host)
        self.metrics_port = self._metrics_http.server_port
        self.grpc = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        for ep in entry_points(group=SERVICE_GROUP):
            ep.load()(self.grpc, self)
        self.grpc_port = self.grpc.add_insecure_port(f"{cfg.grpc_host}:{cfg.grpc_port}")
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.grpc.start()
        loop = asyncio.get_running_loop()
        # Model load and warm-up block for seconds: keep the loop (health checks) answering.
        self.encoder = await loop.run_in_executor(None, SentenceEncoder, self.config.encoder)
        await loop.run_in_executor(None, self.encoder.warmup)
        self.batcher = ContinuousBatcher(self.encoder, batcher_settings(self.config), PrometheusBatchObserver())
        self.batcher.start(loop)
        classifier = await loop.run_in_executor(None, RouteClassifier, self.config, self.encoder.encode)
        self.engine = RoutingEngine(self.config, self.batcher, classifier)
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "router serving",
            extra={"grpc_port": self.grpc_port, "metrics_port": self.metrics_port, "device": self.encoder.device},
        )

    async def _set_health(self, status) -> None:
        for name in ("", EXT_PROC_SERVICE):
            await self.health.set(name, status)

    async def stop(self) -> None:
        """NOT_SERVING first (Envoy and Kubernetes stop sending), finish in-flight streams, drain."""
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        grace = self.config.server.shutdown_grace_s
        if self.grpc is not None:
            await self.grpc.stop(grace)
        if self.batcher is not None:
            await self.batcher.aclose(grace)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        self._stopped.set()
        log.info("router stopped")

    async def run_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        print(f"router ready grpc={self.grpc_port} metrics={self.metrics_port}", flush=True)
        await stop.wait()
        log.info("shutdown requested")
        await self.stop()
