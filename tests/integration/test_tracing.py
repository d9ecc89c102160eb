"""One trace from Envoy through the router to the model batch, through the real Envoy, exported over
OTLP/gRPC to a receiver in the test: Envoy starts it, its ext_proc call carries it to the router,
whose request span is that call's child; the filter chain and the queue wait are the request's
children, and the model batch that served it links back to it."""

from __future__ import annotations

import re

import httpx

from devstack.stack import stack_with
from tests.support.otlp import Receiver
from tests.support.waiting import wait_for


def _attrs(span) -> dict:
    return {a.key: (a.value.string_value or a.value.double_value or a.value.int_value) for a in span.attributes}


def test_one_trace_runs_from_envoy_through_the_router_to_the_model_batch(tmp_path):
    with Receiver() as receiver:
        def traced(config):
            config["tracing"] = {"enabled": True, "endpoint": f"127.0.0.1:{receiver.port}", "sample_ratio": 1.0}
            config["static_tier"] = {"enabled": False}  # the trace must reach the model's batch

        with stack_with(tmp_path, traced) as stack:
            r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                           json={"model": "auto", "messages": [{"role": "user", "content": "solve 7x - 2 = 12 now"}]})
            assert r.status_code == 200 and r.headers["x-semantic-route"] == "math"

            def spans(name: str):
                return [s for service, s in receiver.snapshot() if s.name == name]

            wait_for(lambda: spans("semantic_router.request") and spans("semantic_router.model_batch")
                     and any(service == "envoy" for service, _ in receiver.snapshot()), 20,
                     "spans from Envoy and the router")
            # The request's time, scraped as OpenMetrics, carries its trace id as an exemplar.
            scraped = httpx.get(stack.metrics_url, headers={"accept": "application/openmetrics-text"}).text
        everything = receiver.snapshot()
        (request,) = spans("semantic_router.request")
        trace = request.trace_id
        envoy = {s.span_id: s for service, s in everything if service == "envoy" and s.trace_id == trace}
        assert envoy, "Envoy's spans are in the router's trace"
        assert request.parent_span_id in envoy, "the router's span is a child of Envoy's ext_proc call"
        attrs = _attrs(request)
        assert attrs["semantic_router.route"] == "math" and attrs["gen_ai.request.model"] == "math-model"
        assert attrs["semantic_router.reason"] == "matched"
        children = {s.name: s for s in (s for _, s in everything) if s.trace_id == trace and s.parent_span_id == request.span_id}
        assert {"semantic_router.read_body", "semantic_router.filter_chain"} <= set(children)
        chain = children["semantic_router.filter_chain"].span_id
        filters = {s.name for _, s in everything if s.trace_id == trace and s.parent_span_id == chain}
        assert filters == {"semantic_router.filter.model_policy", "semantic_router.filter.semantic_route"}
        ours = {s.span_id for _, s in everything if s.trace_id == trace}
        (queued,) = [s for _, s in everything if s.name == "semantic_router.queue_wait" and s.trace_id == trace]
        assert queued.parent_span_id in ours
        batches = [s for _, s in everything if s.name == "semantic_router.model_batch"
                   and any(link.trace_id == trace for link in s.links)]
        assert batches and _attrs(batches[0])["semantic_router.batch.size"] >= 1
        assert queued.links[0].span_id == batches[0].span_id
        assert not any("solve" in str(_attrs(s)) for _, s in everything), "no prompt text in a span"
        exemplars = re.findall(r'^semantic_router_processing_seconds_bucket\{.*\} \S+ # \{trace_id="([0-9a-f]{32})"\}',
                               scraped, re.M)
        assert trace.hex() in exemplars


def test_behind_a_model_process_the_call_across_its_socket_is_a_span_of_the_request(tmp_path):
    """A pool (server.workers: 2): the batch runs in the model process, untraced; the worker's call
    across the socket is a span of the request's own trace, inside its filter."""
    with Receiver() as receiver:
        def pooled(config):
            config["server"]["workers"] = 2
            config["tracing"] = {"enabled": True, "endpoint": f"127.0.0.1:{receiver.port}", "sample_ratio": 1.0}

        with stack_with(tmp_path, pooled) as stack:
            r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                           json={"model": "auto", "messages": [{"role": "user", "content": "write a rust macro for logging"}]})
            assert r.status_code == 200

            def named(name: str):
                return [s for _, s in receiver.snapshot() if s.name == name]

            wait_for(lambda: named("semantic_router.request") and named("semantic_router.model_socket"), 20,
                     "the request's span and its model-socket call")
        (request,) = named("semantic_router.request")
        spans = {s.span_id: s for _, s in receiver.snapshot() if s.trace_id == request.trace_id}
        (call,) = [s for s in spans.values() if s.name == "semantic_router.model_socket"]
        parent = spans[call.parent_span_id]
        assert parent.name == "semantic_router.filter.semantic_route"
