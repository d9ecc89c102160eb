"""Building what Envoy sends the router, and sending it: the message builders, an in-process
service on a real grpc.aio server (`Harness`), and a one-shot synchronous client (`route_once`)."""

from __future__ import annotations

import asyncio
import json

import grpc
import numpy as np
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from batching import BatcherSettings, ContinuousBatcher
from esr_app.routing_build import service_settings
from esr_config import parse_config
from esr_extproc.headers import PINNED_NAMESPACE
from esr_extproc.keeper import CacheKeeper
from esr_extproc.service import ExtProcService
from esr_extproc.serving import Serving
from filters.chain import FilterChain
from router.classifier import RouteClassifier
from router.engine import RoutingEngine
from tests.support.fakes import FakeBackend, vector_for

CONFIG = {
    "routes": [
        {"name": "math", "model": "math-model", "utterances": ["solve 3x + 5 = 20"]},
        {"name": "code", "model": "code-model", "utterances": ["write a python function"]},
    ],
    "default_route": {"name": "general", "model": "general-model"},
    "default_threshold": 0.9,
}


def raw_headers_msg(pairs, end_of_stream=False) -> pb.ProcessingRequest:
    """The headers message Envoy sends, with exactly these (name, value) pairs."""
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]),
            end_of_stream=end_of_stream,
        )
    )


def headers_msg(path="/v1/chat/completions", method="POST", extra=(), end_of_stream=False) -> pb.ProcessingRequest:
    """An LLM call's headers message: path, method and JSON content type, then `extra`."""
    return raw_headers_msg([(":path", path), (":method", method), ("content-type", "application/json"), *extra],
                           end_of_stream)


def read_by_envoy(message: pb.ProcessingRequest, model: str = "") -> pb.ProcessingRequest:
    """`message` as the rendered config sends it: with the body's `model` as Envoy read it
    (json_to_metadata; empty: none) in the forwarded metadata."""
    message.metadata_context.filter_metadata[PINNED_NAMESPACE].fields["model"].string_value = model
    return message


def body_msg(obj, end_of_stream=True) -> pb.ProcessingRequest:
    """A body message: bytes as given, anything else as its JSON."""
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=end_of_stream))


def chat(prompt, model="auto"):
    return {"model": model, "messages": [{"role": "user", "content": prompt}]}


def set_headers(resp: pb.ProcessingResponse) -> dict[str, str]:
    common = resp.request_body.response
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


class Harness:
    """A real grpc.aio server on loopback carrying the ext_proc service; one client stream per call."""

    def __init__(self, config=CONFIG, backend=None, cache=None):
        self.config = parse_config(config)
        self.backend = backend or FakeBackend()
        self.cache = cache  # a ResponseCache, served with its keeper as RouterServer does

    async def __aenter__(self):
        self.batcher = ContinuousBatcher(self.backend, BatcherSettings())
        self.batcher.start()
        classifier = RouteClassifier(self.config, lambda texts: np.stack([vector_for(t) for t in texts]))
        self.server = grpc.aio.server()
        self.service = ExtProcService(cache=self.cache)
        pb_grpc.add_ExternalProcessorServicer_to_server(self.service, self.server)
        if self.cache is not None:
            self.server.add_generic_rpc_handlers((CacheKeeper(self.cache).handler(),))
        engine = RoutingEngine(self.config, self.batcher, classifier)
        chain = await FilterChain.for_engine(engine, self.config.filters, self.config.filter_settings)
        self.service.serve(Serving(engine, chain, service_settings(self.config, engine)))  # as RouterServer does
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.ExternalProcessorStub(self.channel)
        return self

    async def __aexit__(self, *exc):
        await self.channel.close()
        await self.server.stop(1)
        await self.batcher.aclose()

    async def exchange(self, *messages) -> list[pb.ProcessingResponse]:
        call = self.stub.Process()
        out = []
        for m in messages:
            await call.write(m)
            out.append(await asyncio.wait_for(call.read(), 5))
        await call.done_writing()
        return out


def run(coro):
    return asyncio.run(coro)


def route_once(port: int, prompt: str, model: str = "auto", timeout: float = 10.0) -> dict[str, str]:
    """The headers the router sets for one chat request (empty if it answered without routing)."""
    return set_headers(send_once(port, [headers_msg(), body_msg(chat(prompt, model))], timeout))


def send_once(port: int, messages: list[pb.ProcessingRequest], timeout: float = 10.0) -> pb.ProcessingResponse:
    """The router's last answer to one request's messages."""
    # A connection of its own (no subchannel shared with earlier calls): a pool's kernel hands
    # each new connection to one of its workers.
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        return list(pb_grpc.ExternalProcessorStub(channel).Process(iter(messages), timeout=timeout))[-1]
