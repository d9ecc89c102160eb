"""The router process's metrics: the batcher's reports (through PrometheusBatchObserver), the event loop and process, config reloads (prefix semantic_router_)."""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from prometheus_client import Counter, Gauge, Histogram

from esr_extproc.metrics import LATENCY_BUCKETS as _LATENCY

_BATCH = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512)
_TOKENS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)

BATCH_SIZE = Histogram("semantic_router_batch_size", "Requests per model batch.", buckets=_BATCH)
BATCH_TOKENS = Histogram(
    "semantic_router_batch_tokens", "Padded tokens (longest x size) per model batch.", buckets=_TOKENS
)
PADDING_RATIO = Histogram(
    "semantic_router_batch_padding_ratio",
    "Share of a batch's padded tokens that are padding.",
    buckets=(0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0),
)
QUEUE_WAIT = Histogram("semantic_router_queue_wait_seconds", "Time a request waited before its batch ran.", buckets=_LATENCY)
INFERENCE = Histogram("semantic_router_inference_seconds", "Model time per batch.", buckets=_LATENCY)
# multiprocess_mode: how a pool's /metrics (esr_app.pool) joins one gauge across its processes;
# ignored when one process does everything.
QUEUE_DEPTH = Gauge("semantic_router_queue_depth", "Requests waiting in the batcher (admitted, not yet batched).",
                    multiprocess_mode="livesum")
QUEUE_TOKENS = Gauge("semantic_router_queue_tokens", "Tokens waiting in the batcher.", multiprocess_mode="livesum")
BATCHER_DROPPED = Counter(
    "semantic_router_batcher_dropped_total",
    "Requests the batcher did not embed, by reason (overload|expired|cancelled|late|error|too_long).",
    ["reason"],
)
TOKENIZED = Counter(
    "semantic_router_tokenized_total",
    "Texts the batcher took, by who tokenized them: batcher (its tokenizer thread) or caller (token ids "
    "a pool's front ends made).",
    ["by"],
)
LOOP_TASKS = Gauge("semantic_router_event_loop_tasks", "asyncio tasks alive in the router (leak watch).")
THREADS = Gauge("semantic_router_threads", "Threads alive in the router process (leak watch).")
LOOP_LAG = Histogram(
    "semantic_router_event_loop_lag_seconds",
    "How late the event loop ran a timer: time a request waits for the loop before the router sees it.",
    buckets=_LATENCY,
)
LOOP_LAG_MAX = Gauge("semantic_router_event_loop_lag_max_seconds",
                     "Largest event-loop lag in the last 10 seconds, by process (router | worker-N | model).",
                     ["process"], multiprocess_mode="livemax")
PROCESS_CPU = Gauge("semantic_router_process_cpu_seconds",
                    "CPU time (user + system, all threads) of each router process (router | worker-N | model).",
                    ["process"], multiprocess_mode="livemax")
CONFIG_RELOADS = Counter("semantic_router_config_reloads_total", "Config reload attempts, by result.", ["result"])
CONFIG_VERSION = Gauge("semantic_router_config_version",
                       "1 for the config version (a hash) each process serves: a pool's workers should agree.",
                       ["process", "version"], multiprocess_mode="liveall")


class PrometheusBatchObserver:
    """Feeds the batcher's reports into the histograms above."""

    def on_batch(self, size: int, tokens: int, padded_tokens: int, inference_s: float, queue_waits_s: Sequence[float]) -> None:
        BATCH_SIZE.observe(size)
        BATCH_TOKENS.observe(padded_tokens)
        PADDING_RATIO.observe(1.0 - tokens / padded_tokens if padded_tokens else 0.0)
        INFERENCE.observe(inference_s)
        observe_many(QUEUE_WAIT, queue_waits_s)

    def on_dropped(self, reason: str, count: int) -> None:
        BATCHER_DROPPED.labels(reason).inc(count)

    def on_queue_depth(self, requests: int, tokens: int) -> None:
        QUEUE_DEPTH.set(requests)
        QUEUE_TOKENS.set(tokens)

    def on_tokenized(self, by: str, count: int) -> None:
        TOKENIZED.labels(by).inc(count)


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for every v (no exemplars): a batch's queue waits in one count per
    bucket, not a lock per request on the model thread. Reads the client's histogram internals
    (its bucket bounds and counters), as its own `observe` does; where a version lacks them, one
    observe per value."""
    bounds, buckets, total = (getattr(histogram, name, None) for name in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None:
        for v in values:
            histogram.observe(v)
        return
    if not len(values):
        return
    # bisect's left side: the first bound a value is <= to, as observe() finds it. Plain Python on
    # a batch's few dozen floats: numpy's conversions cost more than the search.
    counts: dict[int, int] = {}
    for v in values:
        i = bisect_left(bounds, v)
        counts[i] = counts.get(i, 0) + 1
    total.inc(float(sum(values)))
    for i, n in counts.items():
        buckets[i].inc(n)
