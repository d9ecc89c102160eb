"""The remote engine's metrics: calls, their round trips, the circuit breaker (prefix semantic_router_)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

REMOTE_CALLS = Counter(
    "semantic_router_remote_calls_total",
    "Batches sent to the remote embedding engine, by outcome (ok|timeout|error|rejected: the engine refused "
    "these inputs|refused: circuit open, nothing sent).",
    ["outcome"],
)
REMOTE_CALL = Histogram("semantic_router_remote_call_seconds", "Round trip of one batch to the remote engine.",
                        buckets=_LATENCY)
REMOTE_IN_FLIGHT = Gauge("semantic_router_remote_in_flight", "Batches sent to the remote engine, not yet answered.",
                         multiprocess_mode="livesum")
REMOTE_OPEN = Gauge("semantic_router_remote_circuit_open",
                    "1 while the circuit breaker holds calls to the remote engine off (it failed; probes run), else 0.",
                    multiprocess_mode="livemax")
