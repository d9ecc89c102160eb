"""The built-in filters' metrics (prefix semantic_router_)."""

from __future__ import annotations

from prometheus_client import Counter

GUARD_UNDECIDED = Counter(
    "semantic_router_prompt_guard_undecided_total",
    "Requests the prompt guard could not examine (unread body, model unavailable, too many pieces), by what it did.",
    ["reason", "action"],
)
GUARD_SCREENED = Counter(
    "semantic_router_prompt_guard_screened_total",
    "Requests the prompt guard's static screen let on without the encoder (prompt_guard.static_screen).",
)
