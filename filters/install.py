"""Registers the ext_proc service on the router's gRPC server (entry point semantic_router.services)."""

from __future__ import annotations

from typing import Callable

from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from filters.chain import FilterChain
from filters.service import ExtProcService
from router.engine import RoutingEngine


def install(server, app) -> ExtProcService:
    """`app` is the RouterServer. Each engine it builds (start, reload) gets a filter chain built
    from that engine's config and set up against it; the pair goes live together."""
    FilterChain.from_config(app.config.filters, app.config.filter_settings)  # bad filter config fails at start
    live: list[tuple[RoutingEngine, FilterChain] | None] = [None]

    async def prepare(engine: RoutingEngine) -> Callable[[], None]:
        chain = FilterChain.from_config(engine.config.filters, engine.config.filter_settings)
        await chain.setup(engine)

        def commit() -> None:
            live[0] = (engine, chain)

        return commit

    app.on_engine(prepare)
    service = ExtProcService(lambda: live[0])
    pb_grpc.add_ExternalProcessorServicer_to_server(service, server)
    return service
