"""An OTLP/gRPC trace receiver for tests: what Envoy and the router export, decoded with the
opentelemetry-proto messages, as (service name, span) pairs."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from devstack.stack import free_port


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.port = free_port()
        self.spans: list[tuple[str, object]] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"127.0.0.1:{self.port}")

    def Export(self, request, context):
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope in resource_spans.scope_spans:
                    self.spans += [(service, span) for span in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> list[tuple[str, object]]:
        with self._lock:
            return list(self.spans)

    def __enter__(self) -> "Receiver":
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(0)
