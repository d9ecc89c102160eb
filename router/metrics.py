"""Every Prometheus metric the router exports (prefix semantic_router_), in one place."""

from __future__ import annotations

from typing import Sequence

from prometheus_client import Counter, Gauge, Histogram

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_BATCH = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512)
_TOKENS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)

REQUESTS = Counter(
    "semantic_router_requests_total", "Requests processed, by outcome (the x-semantic-route-reason).", ["outcome"]
)
ROUTE_DECISIONS = Counter("semantic_router_route_decisions_total", "Routing decisions, by route.", ["route"])
PROCESSING = Histogram(
    "semantic_router_processing_seconds", "Time from request body received to ext_proc answer.", buckets=_LATENCY
)
PROMPT_TRUNCATED = Counter(
    "semantic_router_prompt_truncated_total",
    "Requests whose routed text was longer than requests.prompt_max_tokens: routed on the part requests.truncate keeps.",
)
BAD_REQUESTS = Counter("semantic_router_bad_requests_total", "Request bodies that could not be used, by kind.", ["kind"])
GUARD_UNDECIDED = Counter(
    "semantic_router_prompt_guard_undecided_total",
    "Requests the prompt guard could not examine (unread body, model unavailable, too many pieces), by what it did.",
    ["reason", "action"],
)
FILTER_FAILURES = Counter(
    "semantic_router_filter_failures_total",
    "Filter chains that timed out or raised (fallback_timeout|fallback_error); a decision made before stands.",
    ["reason"],
)
EMBEDDING_CACHE = Counter(
    "semantic_router_embedding_cache_total",
    "Embedding cache lookups, by result (hit|miss|shared: joined the same text's embedding in flight).",
    ["result"],
)
EMBEDDING_CACHE_ENTRIES = Gauge("semantic_router_embedding_cache_entries", "Embeddings held in the cache.",
                                multiprocess_mode="livesum")
CONVERSATION_TURNS = Histogram(
    "semantic_router_conversation_turns", "User turns read per routed request (conversation.max_turns caps it).",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
)
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
# multiprocess_mode: how a pool's /metrics (app.pool) joins one gauge across its processes;
# ignored when one process does everything.
QUEUE_DEPTH = Gauge("semantic_router_queue_depth", "Requests waiting in the batcher (admitted, not yet batched).",
                    multiprocess_mode="livesum")
QUEUE_TOKENS = Gauge("semantic_router_queue_tokens", "Tokens waiting in the batcher.", multiprocess_mode="livesum")
BATCHER_DROPPED = Counter(
    "semantic_router_batcher_dropped_total",
    "Requests the batcher did not embed, by reason (overload|expired|cancelled|error).",
    ["reason"],
)
LOOP_TASKS = Gauge("semantic_router_event_loop_tasks", "asyncio tasks alive in the router (leak watch).")
THREADS = Gauge("semantic_router_threads", "Threads alive in the router process (leak watch).")
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
STREAMS = Counter("semantic_router_ext_proc_streams_total",
                  "ext_proc streams (one per HTTP request) each process took: how the workers share the load.",
                  ["process"])
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
        for w in queue_waits_s:
            QUEUE_WAIT.observe(w)

    def on_dropped(self, reason: str, count: int) -> None:
        BATCHER_DROPPED.labels(reason).inc(count)

    def on_queue_depth(self, requests: int, tokens: int) -> None:
        QUEUE_DEPTH.set(requests)
        QUEUE_TOKENS.set(tokens)
