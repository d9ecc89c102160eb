"""What Envoy reports to the router's gRPC access-log service, counted: failed tries at backend models
and LLM calls that left Envoy undecided.

The rendered config's router filter logs each upstream attempt that failed (a status of 429 or more,
no response, a timeout), with the model of the endpoint it went to (its metadata), counted by model
and outcome (docs/failover.md); tries per model are Envoy's own count (envoy_cluster_upstream_rq_total).
Its connection manager logs each LLM call that ended without the router's mark
(headers.DECIDED_NAMESPACE), counted by why and by what the undecided policy did with it
(docs/bad-input.md#undecided-requests); Envoy also writes each to its own standard output, which
still works while no router answers."""

from __future__ import annotations

from typing import AsyncIterator

from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from esr_extproc import metrics
from esr_extproc.headers import DECIDED_NAMESPACE

LOG_NAME = "semantic_router_failed_attempts"
UNDECIDED_LOG = "semantic_router_undecided"
MODEL_TAG = "model"  # the custom tag the rendered logger fills from the endpoint's metadata


def outcome(entry: accesslog_pb2.HTTPAccessLogEntry) -> str:
    """The status the model answered, else why there was none."""
    code = entry.response.response_code.value
    if code:
        return str(code)
    flags = entry.common_properties.response_flags
    if flags.upstream_connection_failure or flags.upstream_overflow:
        return "connect_failure"
    if flags.upstream_request_timeout:
        return "timeout"
    if flags.upstream_remote_reset or flags.upstream_connection_termination:
        return "reset"
    return "no_response"


def undecided(entry: accesslog_pb2.HTTPAccessLogEntry) -> tuple[str, str]:
    """(why, outcome) of an undecided call: why as the router said it (shed, not ready, too late to
    route), else no_answer; outcome default_route where the policy sent it to a backend, else refused."""
    said = entry.common_properties.metadata.filter_metadata.get(DECIDED_NAMESPACE)
    why = said.fields["undecided"].string_value if said is not None and "undecided" in said.fields else "no_answer"
    return why[:64], "default_route" if entry.common_properties.upstream_cluster else "refused"


class FailedAttempts(als_pb2_grpc.AccessLogServiceServicer):
    """Both of the rendered config's logs; each of Envoy's streams names its log first."""

    async def StreamAccessLogs(self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
                               context) -> als_pb2.StreamAccessLogsResponse:
        name = LOG_NAME
        async for message in request_iterator:
            if message.HasField("identifier"):
                name = message.identifier.log_name
            for entry in message.http_logs.log_entry:
                if name == UNDECIDED_LOG:
                    metrics.UNDECIDED.labels(*undecided(entry)).inc()
                else:
                    model = entry.common_properties.custom_tags.get(MODEL_TAG) or "unknown"
                    metrics.BACKEND_FAILURES.labels(model[:128], outcome(entry)).inc()
        return als_pb2.StreamAccessLogsResponse()
