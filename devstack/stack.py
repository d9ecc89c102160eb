"""Starts and stops the whole local stack: mock backends, the router process and Envoy."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.envoy_binary import find_envoy
from devstack.mock_backend import MockBackends
from devstack.readiness import http_ok, wait_ready
from esr_app.envoy_config import default_backends, dump, render
from esr_config import RouterConfig, load_config
from esr_extproc.config import BackendConfig

ROOT = Path(__file__).resolve().parent.parent


# Ports a stack listens on are chosen below the kernel's ephemeral range (32768-60999 by default):
# a port the kernel hands out (port 0) may be given again, before the stack binds it, as the local
# port of some outgoing connection (seen: a mock backend's bind failing with EADDRINUSE under
# the suite's load). Each pytest-xdist worker draws from its own slice, so two never pick alike.
_LISTEN_PORTS = range(20000, 32000)
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    slot = int(worker) % 8 if worker.isdigit() else 0
    span = len(_LISTEN_PORTS) // 8
    first = _LISTEN_PORTS.start + slot * span
    for port in random.sample(range(first, first + span), span):
        if port in _HANDED_OUT:  # given to an earlier stack of this process: maybe not bound yet
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port to listen on")


@dataclass
class StackPorts:
    listener: int
    admin: int
    router_grpc: int
    router_metrics: int
    backends: dict[str, int] = field(default_factory=dict)  # model -> its mock backend's port

    @classmethod
    def free(cls, router_config: Path = ROOT / "router.yaml") -> "StackPorts":
        """Free ports for everything, one mock backend per model of `router_config`."""
        models = [b.model for b in default_backends(load_config(router_config))]
        return cls(free_port(), free_port(), free_port(), free_port(), {m: free_port() for m in models})

    @classmethod
    def of_config(cls, config: RouterConfig) -> "StackPorts":
        """The ports the router config itself names (what `make run` uses)."""
        backends = config.backends or default_backends(config)
        return cls(config.envoy.listen_port, config.envoy.admin_port, config.server.grpc_port,
                   config.server.metrics_port, {b.model: b.port for b in backends})


def on_stack_ports(config: RouterConfig, ports: StackPorts) -> RouterConfig:
    """`config` with the stack's ports, every backend a loopback mock: what Envoy's config is
    rendered from (as `semantic-router envoy-config` renders it)."""
    return dataclasses.replace(
        config,
        server=dataclasses.replace(config.server, grpc_port=ports.router_grpc),
        envoy=dataclasses.replace(config.envoy, listen_port=ports.listener, admin_port=ports.admin,
                                  listen_address="127.0.0.1", admin_address="127.0.0.1", router_address="127.0.0.1"),
        backends=tuple(BackendConfig(model=m, address="127.0.0.1", port=p) for m, p in ports.backends.items()),
    )


class Stack:
    def __init__(
        self,
        workdir: Path,
        ports: StackPorts,
        router_config: Path = ROOT / "router.yaml",
        router_args: Sequence[str] = (),
        router_env: Mapping[str, str] | None = None,
        capture_logs: bool = True,
        launch_router: bool = True,
        envoy_config: Path | None = None,
        envoy_patch: Callable[[dict], None] | None = None,
    ):
        """launch_router=False: the caller runs a router on ports.router_grpc itself. envoy_config:
        the router config Envoy's is rendered from, when not the router's own. envoy_patch: edits
        the rendered Envoy config (another gateway's own filters and routes around the router)."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ports = ports
        self.router_config = Path(router_config)
        self.router_args = list(router_args)
        self.router_env = dict(router_env or {})
        self.capture_logs = capture_logs
        self.launch_router = launch_router
        self.envoy_config = Path(envoy_config) if envoy_config is not None else self.router_config
        self.envoy_patch = envoy_patch
        self.backends = MockBackends(ports.backends)
        self.router: subprocess.Popen | None = None
        self.envoy: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.listener}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.router_metrics}/metrics"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> "Stack":
        try:
            self.backends.start()
            # Both at once: Envoy needs no router to start, and each waits on its own work.
            if self.launch_router:
                self._launch_router()
            self._launch_envoy()
            if self.launch_router:
                self._wait(self.router, "router", self.router_serving, timeout)
            self._wait(self.envoy, "envoy", self.envoy_ready, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        running = [p for p in (self.envoy, self.router) if p is not None and p.poll() is None]
        for proc in running:  # both asked at once: the router's drain need not wait for Envoy's
            proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.backends.stop()

    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the router ------------------------------------------------------------------------

    def start_router(self, timeout: float = 180.0) -> None:
        self._launch_router()
        self._wait(self.router, "router", self.router_serving, timeout)

    def _launch_router(self) -> None:
        cmd = [
            sys.executable, "-m", "esr_app", "serve",
            "--config", str(self.router_config),
            "--grpc-port", str(self.ports.router_grpc),
            "--metrics-port", str(self.ports.router_metrics),
            *self.router_args,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.router_env}
        out = open(self.workdir / "router.log", "ab") if self.capture_logs else None
        self.router = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT if out else None)

    def router_serving(self) -> bool:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{self.ports.router_grpc}") as ch:
                reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def kill_router(self, sig: int = signal.SIGKILL) -> None:
        assert self.router is not None
        self.router.send_signal(sig)
        self.router.wait(timeout=60)

    # -- envoy -----------------------------------------------------------------------------

    def start_envoy(self, timeout: float = 60.0) -> None:
        self._launch_envoy()
        self._wait(self.envoy, "envoy", self.envoy_ready, timeout)

    def _launch_envoy(self) -> None:
        rendered = self.workdir / "envoy.rendered.yaml"
        config = render(on_stack_ports(load_config(self.envoy_config), self.ports))
        if self.envoy_patch is not None:
            self.envoy_patch(config)
        rendered.write_text(dump(config))
        cmd = [find_envoy(), "-c", str(rendered), "--log-level", "warn", "--disable-hot-restart"]
        out = open(self.workdir / "envoy.log", "ab") if self.capture_logs else None
        self.envoy = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out else None)

    def envoy_ready(self) -> bool:
        return http_ok(f"http://127.0.0.1:{self.ports.admin}/ready")

    # -- helpers ---------------------------------------------------------------------------

    def _wait(self, proc: subprocess.Popen, name: str, ready, timeout: float) -> None:
        wait_ready(proc, name, ready, timeout, lambda: self.log_tail(name))

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return "(no log captured)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


BODY_MODE_ENV = "ESR_STACK_BODY_MODE"


@contextlib.contextmanager
def stack_with(workdir: Path, change: Callable[[dict], None],
               envoy_change: Callable[[dict], None] | None = None,
               envoy_patch: Callable[[dict], None] | None = None,
               router_env: Mapping[str, str] | None = None) -> Iterator[Stack]:
    """A private stack on router.yaml as `change` edits it (Envoy's config rendered from the edit,
    or from it as `envoy_change` edits it further: a gateway that differs from the router's own;
    `envoy_patch` edits the rendered Envoy config itself; `router_env`: the router's environment added to)."""
    config = yaml.safe_load((ROOT / "router.yaml").read_text())
    change(config)
    if os.environ.get(BODY_MODE_ENV):  # the whole suite through another body mode (make test runs both)
        config.setdefault("envoy", {}).setdefault("request_body_mode", os.environ[BODY_MODE_ENV])
    (workdir / "router.yaml").write_text(yaml.safe_dump(config))
    envoy_config = None
    if envoy_change is not None:
        envoy_change(config)
        envoy_config = workdir / "envoy-source.yaml"
        envoy_config.write_text(yaml.safe_dump(config))
    s = Stack(workdir, StackPorts.free(workdir / "router.yaml"), router_config=workdir / "router.yaml",
              envoy_config=envoy_config, envoy_patch=envoy_patch, router_env=router_env)
    s.start()
    try:
        yield s
    finally:
        s.stop()
