"""A minimal synchronous ext_proc client: sends what Envoy sends for one request, returns the answer."""

from __future__ import annotations

import json

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc


def route_once(port: int, prompt: str, model: str = "auto", timeout: float = 10.0) -> dict[str, str]:
    """The headers the router sets for one chat request (empty if it answered without routing)."""
    headers = [(":method", "POST"), (":path", "/v1/chat/completions"), ("content-type", "application/json")]
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}]}).encode()
    messages = [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers]))),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
    ]
    # A connection of its own (no subchannel shared with earlier calls): a pool's kernel hands
    # each new connection to one of its workers.
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        responses = list(pb_grpc.ExternalProcessorStub(channel).Process(iter(messages), timeout=timeout))
    mutation = responses[-1].request_body.response.header_mutation
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
