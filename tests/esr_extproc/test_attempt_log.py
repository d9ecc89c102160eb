"""What the router counts of the failed tries Envoy reports (esr_extproc/attempt_log.py); through the
real Envoy: tests/integration/test_failover.py."""

from __future__ import annotations

import asyncio

from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2

from esr_extproc.attempt_log import FailedAttempts, outcome
from esr_extproc.metrics import BACKEND_FAILURES


def entry(code: int = 0, model: str | None = "code-model", **flags: bool) -> accesslog_pb2.HTTPAccessLogEntry:
    e = accesslog_pb2.HTTPAccessLogEntry()
    if code:
        e.response.response_code.value = code
    for name, on in flags.items():
        setattr(e.common_properties.response_flags, name, on)
    if model is not None:
        e.common_properties.custom_tags["model"] = model
    return e


def test_an_outcome_is_the_status_else_why_there_was_none():
    assert outcome(entry(503)) == "503" and outcome(entry(429)) == "429"
    assert outcome(entry(upstream_connection_failure=True)) == "connect_failure"
    assert outcome(entry(upstream_request_timeout=True)) == "timeout"
    assert outcome(entry(upstream_remote_reset=True)) == "reset"
    assert outcome(entry()) == "no_response"


def test_each_logged_try_is_counted_by_model_and_outcome():
    def count(model: str, why: str) -> float:
        return BACKEND_FAILURES.labels(model, why)._value.get()

    before = (count("code-model", "503"), count("unknown", "connect_failure"))
    message = als_pb2.StreamAccessLogsMessage()
    message.http_logs.log_entry.extend([entry(503), entry(503), entry(model=None, upstream_connection_failure=True)])

    async def stream():
        yield message

    asyncio.run(FailedAttempts().StreamAccessLogs(stream(), None))
    assert (count("code-model", "503"), count("unknown", "connect_failure")) == (before[0] + 2, before[1] + 1)
