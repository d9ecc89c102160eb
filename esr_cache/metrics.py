"""The response cache's metrics (prefix semantic_router_)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LOOKUPS = Counter("semantic_router_cache_lookups_total", "Cacheable requests looked up, by result (hit, semantic_hit, miss).",
                  ["result"])
STORES = Counter("semantic_router_cache_stores_total", "Answers kept.")
SKIPS = Counter("semantic_router_cache_skips_total",
                "Requests or answers the cache passed by, by reason (no_store, not_ok, cut_short, too_large, "
                "unread_body, not_understood, store_unavailable).", ["reason"])
BYTES = Gauge("semantic_router_cache_bytes", "Bytes of answers held.", multiprocess_mode="livesum")
HIT_AGE = Histogram("semantic_router_cache_hit_age_seconds", "How old a replayed answer was.",
                    buckets=(1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600))
SAVED = Counter("semantic_router_cache_saved_upstream_seconds_total",
                "Backend time the hits did not spend (what each answer took when it was kept).")
