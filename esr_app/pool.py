"""A pool of router processes: one model process and N ext_proc workers that share grpc_port
(SO_REUSEPORT), kept alive (a dead one is started again), with one /metrics for all of them.

Why processes: most of a Python front end's CPU per request goes to grpcio and asyncio, so one
process caps what a GPU node routes (docs/scale-out.md); the model process keeps one batcher (one
GPU stream, or one set of CPU threads) across every worker's prompts.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import multiprocessing as mp
from multiprocessing.process import BaseProcess
from typing import Callable
import os
import queue
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from esr_app import event_loop
from esr_config import RouterConfig
from esr_extproc.children import die_with_parent

log = logging.getLogger(__name__)

MODEL = "model"
_CRASH_LOOP_S = 10.0  # a child that dies sooner than this after its start is restarted with backoff
_BACKOFF_MAX_S = 30.0


def resolve_workers(config: RouterConfig) -> int:
    if config.server.workers != "auto":
        return config.server.workers
    from esr_model import cpu_quota

    return max(1, cpu_quota.detect().cpus // 2)


@dataclasses.dataclass
class _Child:
    name: str  # "model" or "worker-N"
    process: BaseProcess | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = 0.0
    due: float = 0.0  # when a dead child is started again
    ready: bool = False


class WorkerPool:
    def __init__(self, config: RouterConfig, config_path: Path | None, workers: int, log_level: str = "info"):
        self.config = config
        self.config_path = config_path
        self.workers = workers
        self.log_level = log_level
        self._ctx = mp.get_context("spawn")  # a fork of a process with threads (grpc, torch) is unsafe
        self._events = self._ctx.Queue()
        self._children: dict[str, _Child] = {}
        self._stopping = False
        self._workdir = Path(tempfile.mkdtemp(prefix="semantic-router-pool-"))
        self.grpc_port = 0
        self.metrics_port = 0

    # -- set-up ----------------------------------------------------------------------------


    @property
    def children(self) -> tuple[_Child, ...]:
        """The model process and the workers, as they stand (for /metrics)."""
        return tuple(self._children.values())

    def _claim_port(self) -> int:
        """The concrete port the workers will share; refuses one that anyone else holds (the
        workers bind with SO_REUSEPORT and would share it with a stranger)."""
        from esr_app.server import PortInUse  # here: the model process, which imports this module, needs no gRPC

        cfg = self.config.server
        family = socket.AF_INET6 if ":" in cfg.grpc_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((cfg.grpc_host, cfg.grpc_port))
            except OSError as exc:
                raise PortInUse(f"grpc port {cfg.grpc_port} is already in use on {cfg.grpc_host} "
                                "(another router running?)") from exc
            return probe.getsockname()[1]

    def _metrics_dir(self) -> None:
        """prometheus_client's multiprocess mode: every child writes its samples here, and the
        pool's /metrics adds them up (a dead worker's counters stay counted)."""
        given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        path = Path(given) if given else self._workdir / "metrics"
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)  # inherited by every child

    def _serve_metrics(self) -> None:
        registry = CollectorRegistry()
        ChildSamples(registry)
        registry.register(_PoolCollector(self))
        server, _ = start_http_server(self.config.server.metrics_port, addr=self.config.server.metrics_host,
                                      registry=registry)
        self.metrics_port = server.server_port

    # -- children --------------------------------------------------------------------------

    def _start(self, child: _Child, worker_config: RouterConfig) -> None:
        target: Callable[..., None]
        args: tuple
        if child.name == MODEL:
            target, args = _model_main, (self.config, worker_config.encoder.socket, self.log_level, self._events)
        else:
            index = int(child.name.split("-")[1])
            target, args = _worker_main, (worker_config, self.config_path, index, self.log_level, self._events)
        child.process = process = self._ctx.Process(target=target, args=args, name=f"semantic-router-{child.name}")
        process.start()
        child.started_at, child.ready = time.monotonic(), False

    def _reap(self, child: _Child) -> None:
        proc = child.process
        assert proc is not None and proc.pid is not None  # reaped once, after it ran
        multiprocess.mark_process_dead(proc.pid)  # its live gauges leave /metrics
        child.process = None
        lived = time.monotonic() - child.started_at
        child.backoff_s = min(_BACKOFF_MAX_S, max(1.0, 2 * child.backoff_s)) if lived < _CRASH_LOOP_S else 0.0
        child.due = time.monotonic() + child.backoff_s
        if not self._stopping:
            child.restarts += 1
            log.error("router process died; starting it again",
                      extra={"child": child.name, "exitcode": proc.exitcode, "lived_s": round(lived, 1),
                             "restart_in_s": child.backoff_s})

    def run(self) -> int:
        port = self._claim_port()
        self._metrics_dir()
        self._serve_metrics()
        self.grpc_port = port
        socket_path = self.config.encoder.socket or str(self._workdir / "model.sock")
        worker_config = dataclasses.replace(
            self.config,
            encoder=dataclasses.replace(self.config.encoder, socket=socket_path),
            server=dataclasses.replace(self.config.server, grpc_port=port),
        )
        if self.config.encoder.socket is None:
            self._children[MODEL] = _Child(MODEL)
        for i in range(self.workers):
            self._children[f"worker-{i}"] = _Child(f"worker-{i}")
        hup = False

        def on_stop(signum, frame):
            self._stopping = True

        def on_hup(signum, frame):
            nonlocal hup
            hup = True

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)
        for child in self._children.values():
            self._start(child, worker_config)
        announced = False
        try:
            while not self._stopping:
                try:
                    kind, name = self._events.get(timeout=0.2)
                    if kind == "ready" and name in self._children:
                        self._children[name].ready = True
                except queue.Empty:
                    pass
                if hup:
                    hup = False
                    self._signal_workers(signal.SIGHUP)
                for child in self._children.values():
                    if child.process is not None and child.process.exitcode is not None:
                        self._reap(child)
                    if child.process is None and time.monotonic() >= child.due and not self._stopping:
                        self._start(child, worker_config)
                if not announced and all(c.ready for c in self._children.values()):
                    announced = True
                    log.info("router pool serving", extra={"grpc_port": port, "metrics_port": self.metrics_port,
                                                           "workers": self.workers, "socket": socket_path})
                    print(f"router ready grpc={port} metrics={self.metrics_port} workers={self.workers}", flush=True)
        finally:
            self._shutdown()
        return 0

    def _signal_workers(self, sig: int) -> None:
        for child in self._children.values():
            proc = child.process
            if child.name != MODEL and proc is not None and proc.pid is not None and proc.exitcode is None:
                os.kill(proc.pid, sig)

    def _shutdown(self) -> None:
        """Workers drain first (their in-flight requests still need the model), then the model."""
        self._stopping = True
        server = self.config.server
        budget = server.shutdown_delay_s + server.shutdown_grace_s + 5.0
        self._signal_workers(signal.SIGTERM)
        self._join([c for c in self._children.values() if c.name != MODEL], budget)
        model = self._children.get(MODEL)
        if model is not None and model.process is not None and model.process.exitcode is None:
            model.process.terminate()
            self._join([model], server.shutdown_grace_s + 5.0)
        shutil.rmtree(self._workdir, ignore_errors=True)
        log.info("router pool stopped")

    @staticmethod
    def _join(children: list[_Child], timeout: float) -> None:
        end = time.monotonic() + timeout
        for child in children:
            if child.process is None:
                continue
            child.process.join(max(0.0, end - time.monotonic()))
            if child.process.exitcode is None:
                log.warning("router process did not stop in time; killing it", extra={"child": child.name})
                child.process.kill()
                child.process.join(5.0)


class ChildSamples(multiprocess.MultiProcessCollector):
    """prometheus_client's multiprocess reader, minus the files a child is creating right now.

    A child opens its file empty and sizes it a moment later; a scrape in between made the
    stock reader fail the whole /metrics with a 500 (seen while a worker restarted). A file
    under its 8-byte header holds no samples yet, and one removed since the glob (a dead
    child's live gauge) has none left.
    """

    _HEADER = 8

    def collect(self):
        return self.merge([f for f in glob.glob(os.path.join(self._path, "*.db")) if _size(f) >= self._HEADER],
                          accumulate=True)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


class _PoolCollector:
    """The pool's own view: which processes are up and how often each was started again."""

    def __init__(self, pool: WorkerPool):
        self._pool = pool

    def collect(self):
        up = GaugeMetricFamily("semantic_router_pool_process_up", "1 while a pool process runs (model | worker-N).",
                               labels=["process"])
        restarts = CounterMetricFamily("semantic_router_pool_restarts",
                                       "Times a pool process died and was started again.", labels=["process"])
        ready = GaugeMetricFamily("semantic_router_pool_process_ready",
                                  "1 once a pool process serves (a worker: listening, routes built; the model: "
                                  "answering on its socket), until it dies.", labels=["process"])
        pids = GaugeMetricFamily("semantic_router_pool_process_pid", "Each running pool process's pid.",
                                 labels=["process"])
        for child in self._pool.children:
            proc = child.process
            alive = proc is not None and proc.exitcode is None
            up.add_metric([child.name], 1.0 if alive else 0.0)
            ready.add_metric([child.name], 1.0 if alive and child.ready else 0.0)
            restarts.add_metric([child.name], child.restarts)
            if proc is not None and alive and proc.pid is not None:
                pids.add_metric([child.name], proc.pid)
        yield up
        yield ready
        yield restarts
        yield pids


# -- what runs in each child (module-level: spawn pickles them by name) -------------------------

def _child_setup(log_level: str, name: str) -> None:
    from esr_app.logs import setup_logging

    # Ctrl-C reaches the whole process group: only the pool acts on it, stopping workers before
    # the model. A child also goes when the pool dies, however it dies (a stray worker would keep
    # the port).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(signal.SIGTERM)
    setup_logging(log_level, process=name)


def _model_main(config: RouterConfig, socket_path: str, log_level: str, events) -> None:
    _child_setup(log_level, MODEL)
    from esr_app.model_process import ModelProcess

    event_loop.run(ModelProcess(config, socket_path).run_until_signal(
        on_ready=lambda: events.put(("ready", MODEL)), signals=(signal.SIGTERM,)), config.server.event_loop)


def _worker_main(config: RouterConfig, config_path: Path | None, index: int, log_level: str, events) -> None:
    name = f"worker-{index}"
    _child_setup(log_level, name)
    from esr_app.server import RouterServer

    server = RouterServer(config, config_path, pool_worker=index)
    event_loop.run(server.run_until_signal(on_ready=lambda: events.put(("ready", name)), signals=(signal.SIGTERM,)),
                   config.server.event_loop)
