"""The routing engine's metrics: its embedding cache, the conversations it reads, the models it passes over (prefix semantic_router_)."""

from __future__ import annotations

import functools

from prometheus_client import Counter, Gauge, Histogram

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
DECISIONS_BY_TIER = Counter(
    "semantic_router_decisions_by_tier_total",
    "Requests a model routed, by the cascade tier that decided (static: the static embedding, also its guess "
    "on a fallback; encoder: the transformer).",
    ["tier"],
)
MODELS_SKIPPED = Counter(
    "semantic_router_models_skipped_total",
    "A ranked model passed over for a request it cannot serve, by model and what it lacks "
    "(context|tools|images|structured_output|streaming).",
    ["model", "capability"],
)
SELECTED = Counter(
    "semantic_router_selected_total",
    "Requests for which selection chose among a route's models by predicted quality and price, by the model chosen.",
    ["model"],
)
PREDICTED_QUALITY = Histogram(
    "semantic_router_selected_predicted_quality",
    "The predicted score of the model selection chose, per request.",
    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0),
)
SPEND = Counter(
    "semantic_router_selected_spend_total",
    "The price of the models selection chose, summed (in the prices' unit), by model.",
    ["model"],
)
EXPLORED = Counter(
    "semantic_router_selection_explored_total",
    "Selected requests sent to another capable model than the ranked first, so that it keeps earning "
    "feedback (selection.feedback.explore), by the model sent to.",
    ["model"],
)
FEEDBACK = Counter(
    "semantic_router_selection_feedback_total",
    "Scores posted to the feedback path, by outcome (accepted|unauthorized|bad_body|bad_id|expired|repeated|off); "
    "in a pool, scores another worker accepted (shared, or shared_<why> where not folded in: shared_repeated).",
    ["outcome"],
)
CORRECTION = Gauge(
    "semantic_router_selection_correction",
    "What feedback adds to a model's predicted score on a route, after its last score (each process its own).",
    ["route", "model"], multiprocess_mode="liveall",
)
NO_CAPABLE_MODEL = Counter(
    "semantic_router_no_capable_model_total",
    "Requests whose route had no model able to serve them, sent to the default route's models instead, by route.",
    ["route"],
)


@functools.lru_cache(maxsize=4096)  # label values are routes, reasons and tiers: a config's few
def child(metric, *values: str):
    """`metric.labels(*values)`, looked up once: prometheus_client's labels() costs ~2 us (str() of
    each value, a lock, a dict), and a routed request counts three labelled metrics."""
    return metric.labels(*values)
