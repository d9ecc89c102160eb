"""The least an ext_proc router can do for a pinned request, as a yardstick for the front end's cost:
grpc.aio, the same codec (xds-protos), the same answers Envoy needs (strip at the headers, then the
route headers from the body's `model`), and nothing else: no config, no filters, no metrics.

    python -m bench.frontend.minimal_servicer PORT     # prints "router ready" once it serves
"""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

STRIP = ("x-selected-model", "x-semantic-route", "x-semantic-route-reason")


class Minimal(pb_grpc.ExternalProcessorServicer):
    async def Process(self, request_iterator, context):
        async for message in request_iterator:
            kind = message.WhichOneof("request")
            if kind == "request_headers":
                yield pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=pb.CommonResponse(
                    header_mutation=pb.HeaderMutation(remove_headers=STRIP))))
            elif kind == "request_body":
                model = str(json.loads(message.request_body.body).get("model", ""))
                headers = [base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode()))
                           for k, v in (("x-selected-model", model), ("x-semantic-route", "pinned"),
                                        ("x-semantic-route-reason", "model_pinned"))]
                yield pb.ProcessingResponse(request_body=pb.BodyResponse(response=pb.CommonResponse(
                    header_mutation=pb.HeaderMutation(set_headers=headers), clear_route_cache=True)))
            else:
                return


async def serve(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(Minimal(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("router ready", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
