"""OpenTelemetry traces of what the router does for a request, continuing the trace Envoy started
(W3C trace context in the ext_proc call's metadata): a span for the request's body, its read, the
filter chain and the cache lookup, with the decision as attributes; the batcher's queue wait as a
span of the request's, and each model batch as a span of its own linked from every request it
served. Exported over OTLP/gRPC, sampled parent-based (a trace Envoy sampled is traced here too; one
that starts here is kept at `sample_ratio`). Off by default; the SDK is imported only when on. No
prompt text goes into a span."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from esr_settings import ConfigError, require


@dataclass(frozen=True)
class TracingConfig:
    """The `tracing:` section."""

    enabled: bool = False
    endpoint: str = "127.0.0.1:4317"  # an OTLP/gRPC receiver (a collector), host:port
    sample_ratio: float = 0.1  # traces that start at the router or at Envoy; a parent's choice is followed
    service_name: str = "semantic-router"
    envoy: bool = True  # the rendered Envoy config traces to the same receiver, and starts the traces

    def __post_init__(self):
        require(0.0 <= self.sample_ratio <= 1.0, "sample_ratio", "must be between 0 and 1")
        host, _, port = self.endpoint.rpartition(":")
        require(bool(host) and port.isdigit() and 1 <= int(port) <= 65535, "endpoint", "must be host:port")


class Tracing:
    def __init__(self, config: TracingConfig, process: str = "router"):
        try:
            from opentelemetry import trace
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import SpanLimits, TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:  # optional: the default install and the image serve without it
            raise ConfigError(f"tracing.enabled: OpenTelemetry's SDK and OTLP exporter do not import ({exc}): "
                              "pip install 'envoy-semantic-router[tracing]', then opentelemetry-proto again "
                              "(docs/tracing.md)") from None

        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name, "service.instance.id": process}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
            # Each span's size is bounded whatever a filter or plugin sets on it, so one request
            # cannot crowd other clients' spans out of the exporter's batches.
            span_limits=SpanLimits(max_attributes=SPAN_ATTRIBUTES_MAX, max_attribute_length=ATTRIBUTE_MAX,
                                   max_events=16, max_links=4, max_event_attributes=16, max_link_attributes=16))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.endpoint, insecure=True)))
        self.tracer = self._provider.get_tracer("semantic_router")

    @contextlib.contextmanager
    def request(self, metadata: Sequence[tuple[str, Any]]) -> Iterator[Any]:
        """The span of one request's body, current within, a child of the span Envoy's ext_proc call
        carries in its metadata (`traceparent`), else a new trace's root."""
        carrier = {k: v for k, v in metadata if isinstance(v, str)}
        parent = self._propagator.extract(carrier)
        with self.tracer.start_as_current_span("semantic_router.request", context=parent,
                                               kind=self._trace.SpanKind.SERVER) as span:
            yield span

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[Any]:
        with self.tracer.start_as_current_span(name) as span:
            yield span

    def exemplar(self) -> dict[str, str] | None:
        """The current span's trace id as a metric exemplar, where the span is sampled."""
        context = self._trace.get_current_span().get_span_context()
        return {"trace_id": format(context.trace_id, "032x")} if context.is_valid and context.trace_flags.sampled else None

    def batch_hook(self, items: Sequence[Any], tokens: int, started_ns: int, ended_ns: int,
                   waits: Sequence[float]) -> None:
        """From the model thread (batching.BatchHook): the batch's span, linked from each request's
        span, and each request's wait in the queue as a span of its own trace."""
        trace = self._trace
        # Each request's span, read once from the context it submitted in (None: not traced).
        spans = [item.origin.run(trace.get_current_span) if item.origin is not None else None for item in items]
        served = [(item, span, wait) for item, span, wait in zip(items, spans, waits)
                  if span is not None and span.get_span_context().is_valid]
        if not served:
            return
        batch = self.tracer.start_span("semantic_router.model_batch", start_time=started_ns,
                                       links=[trace.Link(span.get_span_context()) for _, span, _ in served],
                                       attributes={"semantic_router.batch.size": len(items),
                                                   "semantic_router.batch.tokens": tokens})
        batch.end(ended_ns)
        for item, span, wait in served:
            queued = self.tracer.start_span("semantic_router.queue_wait", context=trace.set_span_in_context(span),
                                            start_time=started_ns - int(wait * 1e9),
                                            links=[trace.Link(batch.get_span_context())],
                                            attributes={"semantic_router.tokens": item.n_tokens})
            queued.end(started_ns)

    def shutdown(self) -> None:
        self._provider.shutdown()


ATTRIBUTE_MAX = 256  # characters of a client's value in a span attribute, and of any attribute
SPAN_ATTRIBUTES_MAX = 64  # attributes a span keeps: with ATTRIBUTE_MAX, at most 16 Ki characters a span


def decision_attributes(decision: Any, requested_model: str | None, cache: str | None) -> dict[str, Any]:
    """The decision as span attributes; gen_ai.request.model is the model the backend is asked for."""
    out = {"gen_ai.request.model": decision.model, "semantic_router.route": decision.route,
           "semantic_router.reason": decision.reason, "semantic_router.score": round(decision.score, 4),
           "semantic_router.confidence": round(decision.confidence, 4)}
    if decision.tier:
        out["semantic_router.tier"] = decision.tier
    if requested_model is not None:  # the client's own value: cut, so one request cannot crowd others' spans out
        out["semantic_router.requested_model"] = requested_model[:ATTRIBUTE_MAX]
    if cache is not None:
        out["semantic_router.cache"] = cache
    return out
