"""The Envoy ext_proc gRPC service: one stream per HTTP request, its messages answered in order
(headers, body, the answer's body for the response cache): the stream protocol only; each phase's
answer is its own module's (headers_phase, body_modes, body_phase)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from esr_cache.cache import ResponseCache
from esr_extproc import body_modes, metrics, replies
from esr_extproc.body_parser import BodyParser
from esr_extproc.body_phase import answer_body
from esr_extproc.headers_phase import on_headers
from esr_extproc.records import DecisionRecorder
from esr_extproc.serving import Serving
from esr_extproc.shedding import Admission
from esr_extproc.stream import RequestStream
from router.engine import RoutingEngine

if TYPE_CHECKING:  # what the service is given to pass on to the body phase
    from esr_extproc.tracing import Tracing

log = logging.getLogger(__name__)


class ExtProcService(pb_grpc.ExternalProcessorServicer):
    def __init__(self, process: str = "router", cache: ResponseCache | None = None,
                 records: DecisionRecorder | None = None, tracing: Tracing | None = None):
        self._streams = metrics.STREAMS.labels(process)
        self.cache = cache  # None: no response cache
        self.records = records  # None: no decision records
        self.tracing = tracing  # None: no traces
        # Swapped whole by a config reload (serve) without touching requests in flight. None until
        # the first engine is built.
        self.serving: Serving | None = None
        self._bodies = BodyParser()
        self.admission = Admission()  # LLM calls being decided (server.max_in_flight, server.client_share)

    def start(self) -> None:
        """Starts what serving needs beside the engine: the worker process for large bodies."""
        self._bodies.start()

    def serve(self, serving: Serving) -> None:
        self.serving = serving

    @property
    def in_flight(self) -> int:
        return self.admission.total

    @property
    def engine(self) -> RoutingEngine | None:
        return self.serving.engine if self.serving is not None else None

    def close(self) -> None:
        self._bodies.close()
        if self.records is not None:
            self.records.close()

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest], context) -> None:
        """One HTTP request's stream. Read and answered through grpc.aio's reader/writer calls: an
        async generator each way costs the loop its bookkeeping on every message."""
        stream = RequestStream()
        if self.tracing is not None:
            stream.trace_metadata = tuple(context.invocation_metadata() or ())
        self._streams.inc()
        try:
            while (request := await context.read()) is not grpc.aio.EOF:
                kind = request.WhichOneof("request")
                if request.HasField("protocol_config"):  # the first message says how Envoy sends bodies
                    stream.body_mode = request.protocol_config.request_body_mode
                if kind == "request_headers":
                    answer = on_headers(request, stream, self.serving, self.admission, self.cache)
                    if stream.duplex and stream.llm_call and not request.request_headers.end_of_stream \
                            and answer.HasField("request_headers"):
                        # Full duplex: the headers answer waits for the whole body (it carries the route).
                        stream.held_headers = answer
                        continue
                    await context.write(answer)
                    if request.request_headers.end_of_stream and stream.llm_call:
                        return  # no body: answered at the headers phase
                    continue
                if kind == "request_body":
                    if not stream.method:  # Envoy sent no headers message (request_header_mode: SKIP)
                        stream.from_attributes(request)
                    answers = await body_modes.on_chunk(stream, request.request_body, self._limit(), self._on_body,
                                                        self._on_whole)
                elif kind == "request_trailers":
                    answers = await body_modes.on_trailers(stream, self._limit(), self._on_body)
                elif kind == "response_body" and stream.cache is not None and stream.cache.key is not None:
                    stream.cache.on_answer(request.response_body.body, request.response_body.end_of_stream)
                    answers = [pb.ProcessingResponse(response_body=pb.BodyResponse())]
                else:
                    passed = replies.pass_through(kind)
                    answers = [passed] if passed is not None else []
                for answer in answers:
                    await context.write(answer)
        finally:
            self._release(stream)

    async def _on_whole(self, stream: RequestStream) -> pb.ProcessingResponse:
        """A whole body outside full duplex: from now to its answer the call holds an admission slot;
        once answered, what the stream waits for is the backend's."""
        self._admit(stream)
        try:
            return await self._on_body(stream)
        finally:
            self._release(stream)

    def _admit(self, stream: RequestStream) -> None:
        """The whole body is here: from now to its answer the call holds a slot (shedding.Admission)."""
        if stream.holders is not None and not stream.admitted:
            stream.admitted = True
            self.admission.admit(stream.holders)

    def _release(self, stream: RequestStream) -> None:
        if stream.admitted and stream.holders is not None:
            stream.admitted = False
            self.admission.release(stream.holders)

    def _limit(self) -> int | None:
        """Envoy's own request limit, the most a held body may grow to (None: not serving yet)."""
        return self.serving.settings.max_inflated_bytes if self.serving is not None else None

    async def _on_body(self, stream: RequestStream) -> pb.ProcessingResponse:
        return await answer_body(stream, self.serving, self._bodies, self.records, self.tracing)
