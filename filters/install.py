"""Registers the ext_proc service on the router's gRPC server (entry point semantic_router.services)."""

from __future__ import annotations

from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from filters.chain import FilterChain
from filters.service import ExtProcService


def install(server, app) -> ExtProcService:
    """`app` is the RouterServer; its config and engine may be swapped on reload."""
    built: dict[tuple[str, ...], FilterChain] = {}

    def chain() -> FilterChain:
        names = app.config.filters
        if names not in built:
            built.clear()
            built[names] = FilterChain.from_names(names)
        return built[names]

    chain()  # an unknown filter name fails at start, not on the first request
    service = ExtProcService(engine=lambda: app.engine, chain=chain)
    pb_grpc.add_ExternalProcessorServicer_to_server(service, server)
    return service
