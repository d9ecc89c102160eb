"""The ext_proc service's metrics: requests by outcome, decisions by route, bodies it could not use (prefix semantic_router_)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

REQUESTS = Counter(
    "semantic_router_requests_total", "Requests processed, by outcome (the x-semantic-route-reason).", ["outcome"]
)
ROUTE_DECISIONS = Counter("semantic_router_route_decisions_total", "Routing decisions, by route.", ["route"])
PROCESSING = Histogram(
    "semantic_router_processing_seconds", "Time from request body received to ext_proc answer.", buckets=LATENCY_BUCKETS
)
PROMPT_TRUNCATED = Counter(
    "semantic_router_prompt_truncated_total",
    "Requests whose routed text was longer than requests.prompt_max_tokens: routed on the part requests.truncate keeps.",
)
BAD_REQUESTS = Counter("semantic_router_bad_requests_total", "Request bodies that could not be used, by kind.", ["kind"])
FILTER_FAILURES = Counter(
    "semantic_router_filter_failures_total",
    "Filter chains that timed out or raised (fallback_timeout|fallback_error); a decision made before stands.",
    ["reason"],
)
STREAMS = Counter("semantic_router_ext_proc_streams_total",
                  "ext_proc streams (one per HTTP request) each process took: how the workers share the load.",
                  ["process"])
SHED = Counter("semantic_router_shed_at_headers_total",
               "LLM calls shed at their headers, by why: fallback_overload (server.max_in_flight reached, or waited "
               "past server.shed_wait_ms), fallback_client_share (one client's or tenant's share of it). Envoy takes "
               "them by envoy.undecided, or the router refuses them (429) where that refuses.", ["why"])
UNDECIDED = Counter("semantic_router_undecided_total",
                    "LLM calls that left Envoy without the router's decision, as Envoy's rendered config reports "
                    "them (esr_extproc/attempt_log.py): by why (the router's own word, else no_answer: down, "
                    "out of time or failed) and outcome (default_route: sent on by the undecided policy; refused).",
                    ["why", "outcome"])
RECORDS = Counter("semantic_router_decision_records_total",
                  "Decision records, by outcome: written, or dropped (rate_limited, queue_full) or failed (error); "
                  "rotated: a file moved to .1 (records.max_bytes, max_age_s).",
                  ["outcome"])
BACKEND_FAILURES = Counter(
    "semantic_router_backend_failures_total",
    "Tries at a backend model that failed, as Envoy's rendered config reports them (esr_extproc/attempt_log.py), "
    "by model and outcome (the status, 429 or more; connect_failure, timeout, reset, no_response). "
    "Tries per model: envoy_cluster_upstream_rq_total.",
    ["model", "outcome"],
)
