"""The real RouterServer on a private event loop in a thread, with a model the test controls."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Callable, Iterator

import yaml

from devstack.stack import ROOT, Stack, StackPorts
from esr_config import parse_config
from esr_app.server import RouterServer


class InProcessRouter:
    def __init__(self, config: dict, backend):
        self.config = parse_config(config)
        self.backend = backend
        self.loop = asyncio.new_event_loop()
        self.server: RouterServer | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="inproc-router", daemon=True)

    def start(self) -> "InProcessRouter":
        self._thread.start()
        self.server = RouterServer(self.config, None, backend_factory=lambda cfg: self.backend)
        self.call(self.server.start())
        return self

    def call(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.server is not None:
            self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def inproc_stack_with(workdir: Path, backend, change: Callable[[dict], None]) -> Iterator[Stack]:
    """Envoy and mock backends in front of an in-process router on `backend`, its config router.yaml
    as `change` edits it (ports set here)."""
    config = yaml.safe_load((ROOT / "router.yaml").read_text())
    ports = StackPorts.free()
    change(config)
    config["server"].update(grpc_port=ports.router_grpc, metrics_port=ports.router_metrics)
    router = InProcessRouter(config, backend).start()
    try:
        stack = Stack(workdir, ports, launch_router=False).start()
        try:
            yield stack
        finally:
            stack.stop()
    finally:
        router.stop()
