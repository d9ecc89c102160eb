"""RouterServer start and stop: readiness only once warm; stop goes NOT_SERVING first and drains."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from batching import BatcherClosed
from esr_config import parse_config
from esr_app.server import PortInUse, RouterServer
from tests.support.fakes import FakeBackend
from tests.support.waiting import until
from tests.support.extproc import CONFIG, body_msg, chat, headers_msg, set_headers

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def config():
    return parse_config({**CONFIG, "server": {"grpc_port": 0, "metrics_port": 0, "deadline_ms": 5000,
                                              "shutdown_grace_s": 5, "shutdown_delay_s": 1.0}})


@contextlib.asynccontextmanager
async def serving():
    """A started RouterServer on a fake model, stopped on exit."""
    server = RouterServer(config(), None, backend_factory=lambda cfg: FakeBackend())
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def route(server: RouterServer, prompt: str) -> str:
    """One request through the server's ext_proc port: the route it got."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        call = pb_grpc.ExternalProcessorStub(ch).Process()
        await call.write(headers_msg())
        await call.read()
        await call.write(body_msg(chat(prompt)))
        headers = set_headers(await call.read())
        await call.done_writing()
    return headers["x-semantic-route"]


async def health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        return reply.status


async def until_health(port: int, status: int) -> None:
    async def reached():
        return await health(port) == status
    await until(reached, 10, f"health status {status}")


@pytest.mark.processes
def test_stop_reports_not_serving_then_finishes_in_flight_requests():
    async def main():
        backend = FakeBackend()
        server = RouterServer(config(), None, backend_factory=lambda cfg: backend)
        await server.start()
        port = server.grpc_port
        assert await health(port) == SERVING
        backend.gate.clear()  # the next request stays on the model until released

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = pb_grpc.ExternalProcessorStub(ch).Process()
            await call.write(headers_msg())
            await call.read()
            await call.write(body_msg(chat("solve 3x + 5 = 20")))
            await asyncio.to_thread(backend.entered.wait, 5)

            stopping = asyncio.create_task(server.stop())
            await until_health(port, NOT_SERVING)  # Envoy / Kubernetes stop sending first
            assert not stopping.done()  # ... while the request in flight is still being served
            backend.gate.set()
            resp = await asyncio.wait_for(call.read(), 5)
            assert set_headers(resp)["x-semantic-route"] == "math"
            await call.done_writing()
            await asyncio.wait_for(stopping, 10)

    asyncio.run(main())


@pytest.mark.processes
def test_health_is_not_serving_until_the_model_is_warm():
    async def main():
        backend = FakeBackend()
        warm = asyncio.Event()
        loop = asyncio.get_running_loop()

        def slow_warmup():
            asyncio.run_coroutine_threadsafe(warm.wait(), loop).result(10)

        backend.warmup = slow_warmup
        server = RouterServer(config(), None, backend_factory=lambda cfg: backend)
        starting = asyncio.create_task(server.start())
        await until(lambda: server.grpc_port, 10, "the gRPC port open while the model warms up")
        await until_health(server.grpc_port, NOT_SERVING)  # listening, not yet serving
        assert not starting.done()
        warm.set()
        await starting
        assert await health(server.grpc_port) == SERVING
        await server.stop()

    asyncio.run(main())


@pytest.mark.processes
def test_start_up_objects_are_frozen_out_of_the_collector_but_the_engine_is_not():
    # Full collections over torch's objects stalled the model thread ~190 ms; a reload's old
    # engine must still be collectable, so it is built after the freeze.
    async def main():
        async with serving() as server:
            collectable = gc.get_objects()  # everything the collector still scans (not the frozen)
            assert gc.get_freeze_count() > 0
            assert not any(o is server.backend for o in collectable)
            assert any(o is server.engine for o in collectable)

    asyncio.run(main())


@pytest.mark.processes
def test_a_second_router_cannot_share_a_running_routers_port():
    async def main():
        async with serving() as first:
            taken = parse_config({**CONFIG, "server": {"grpc_port": first.grpc_port, "metrics_port": 0}})
            second = RouterServer(taken, None, backend_factory=lambda cfg: FakeBackend())
            with pytest.raises(PortInUse, match=f"grpc port {first.grpc_port} is already in use"):
                await second.start()
            assert await health(first.grpc_port) == SERVING  # the first one keeps serving

    asyncio.run(main())


@pytest.mark.processes
def test_health_command_reports_serving_for_probes():
    from esr_app.cli import main as cli

    async def main():
        async with serving() as server:
            ok = await asyncio.to_thread(cli, ["health", "--address", f"127.0.0.1:{server.grpc_port}"])
        gone = await asyncio.to_thread(cli, ["health", "--address", f"127.0.0.1:{server.grpc_port}", "--timeout", "0.5"])
        assert (ok, gone) == (0, 1)

    asyncio.run(main())


@pytest.mark.processes
def test_serves_ext_proc_without_any_installed_entry_points(monkeypatch):
    """A checkout that was never `pip install`ed has no entry points: the router must still serve
    ext_proc (it used to report SERVING with no ext_proc service behind it)."""
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: importlib.metadata.EntryPoints(()))

    async def main():
        async with serving() as server:
            assert await health(server.grpc_port) == SERVING
            assert await route(server, "solve 3x + 5 = 20") == "math"

    asyncio.run(main())


def test_serving_is_never_reported_without_an_engine():
    async def main():
        server = RouterServer(config(), None, backend_factory=lambda cfg: FakeBackend())
        with pytest.raises(RuntimeError, match="no engine"):
            await server._set_health(SERVING)

    asyncio.run(main())


@pytest.mark.processes
def test_sighup_reload_task_is_held_until_done(tmp_path):
    """The loop keeps only weak references to tasks: an unreferenced reload could be collected mid-flight."""
    import yaml

    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(CONFIG))

    async def main():
        server = RouterServer(config(), path, backend_factory=lambda cfg: FakeBackend())
        await server.start()
        try:
            task = server.on_sighup()
            assert task in server._tasks
            gc.collect()
            assert await task is True
            assert task not in server._tasks
        finally:
            await server.stop()

    asyncio.run(main())


@pytest.mark.processes
def test_reload_with_a_new_encoder_model_swaps_it_in_and_drains_the_old_one(tmp_path):
    """fit --finetune writes a new model directory; pointing the config at it takes no restart."""
    import yaml

    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "encoder": {"model": "old-model"}}))
    loaded: list[str] = []

    def factory(cfg):
        loaded.append(cfg.encoder.model)
        return FakeBackend()

    async def main():
        server = RouterServer(config(), path, backend_factory=factory)
        await server.start()
        try:
            old = server.embedder
            path.write_text(yaml.safe_dump({**CONFIG, "encoder": {"model": "new-model"}}))
            assert await server.reload("test") is True
            assert loaded[-1] == "new-model" and server.embedder is not old
            assert server.engine.batcher is server.embedder and server.engine.cache is not None
            assert server.config.encoder.model == "new-model"
            # The new engine routes on the new batcher; the old one is drained and closed.
            assert await route(server, "solve 3x + 5 = 20") == "math"
            with pytest.raises(BatcherClosed):
                await old.embed("too late for the old model", time.monotonic() + 1)
        finally:
            await server.stop()

    asyncio.run(main())
