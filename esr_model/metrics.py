"""The model's metrics: the CPU budget and the threads each batch ran with (prefix semantic_router_)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

_BATCH = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512)

CPU_BUDGET = Gauge(
    "semantic_router_cpu_budget", "CPUs the router may use: affinity mask and CFS quota (cgroup v1/v2), smallest.",
    multiprocess_mode="livemax",
)
MODEL_THREADS = Gauge("semantic_router_model_threads", "torch threads the model thread runs its current batch with.",
                      multiprocess_mode="livemax")
THREAD_BATCHES = Counter(
    "semantic_router_model_thread_batches_total",
    "Model batches by the torch thread count they ran with (fewer than the budget: CPU contention).",
    ["threads"],
)
