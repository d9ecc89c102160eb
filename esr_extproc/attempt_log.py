"""Failed tries at backend models, as Envoy reports them: the rendered config's router filter logs
each upstream attempt that failed (a status of 429 or more, no response, a timeout) to this gRPC
access-log service, with the model of the endpoint it went to (its metadata), and the router counts
them by model and outcome (docs/failover.md). Tries per model are Envoy's own count
(envoy_cluster_upstream_rq_total); which of them failed, and how, is this one."""

from __future__ import annotations

from typing import AsyncIterator

from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc

from esr_extproc import metrics

LOG_NAME = "semantic_router_failed_attempts"
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


class FailedAttempts(als_pb2_grpc.AccessLogServiceServicer):
    async def StreamAccessLogs(self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],
                               context) -> als_pb2.StreamAccessLogsResponse:
        async for message in request_iterator:
            for entry in message.http_logs.log_entry:
                model = entry.common_properties.custom_tags.get(MODEL_TAG) or "unknown"
                metrics.BACKEND_FAILURES.labels(model[:128], outcome(entry)).inc()
        return als_pb2.StreamAccessLogsResponse()
