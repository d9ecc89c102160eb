"""The response cache's semantic matching measured, and its thresholds tuned, on labelled data with
intents: each example is looked up among the earlier ones (in a seeded random order, the requests
of one tenant, single-turn) with the served scope and index code, on its routed route. On a route a
team turned semantic matching on, an answer is the same for one intent: a hit from another intent is
false, one from its own intent is a paraphrase hit."""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np

from esr_cache.keys import scope_key
from esr_cache.semantic import SemanticIndex, turn_length

THRESHOLDS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # 0.50 ... 0.95
MAX_FALSE_SHARE = 0.005  # of a route's requests


def replay(routes: Sequence[str], texts: Sequence[str], intents: Sequence[str], vectors: np.ndarray,
           semantic: set[str], threshold: float, seed: int = 0) -> dict[str, dict]:
    """Per semantic route: requests, false hits, paraphrase hits and the requests that could have
    had one (an earlier request of their intent, answered by the backend, in the scope)."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    index, kept = SemanticIndex(max_bytes=10**12, per_scope=1_000_000), dict[str, int]()
    out = {r: {"requests": 0, "false_hits": 0, "paraphrase_hits": 0, "eligible": 0} for r in semantic}
    seen: dict[str, set[str]] = {}
    for i in order:
        route = routes[i]
        if route not in semantic:
            continue
        row = out[route]
        row["requests"] += 1
        # Each text is a one-message request: no member but `messages`, no history before it, so
        # one route's requests share a scope, as they do behind the server.
        scope = scope_key("tenant", route, {}, "")
        row["eligible"] += intents[i] in seen.get(scope, set())
        near = index.nearest(scope, vectors[i], threshold, turn_length(texts[i]))
        if near is not None and texts[kept[near[0]]] != texts[i]:
            same = intents[kept[near[0]]] == intents[i]
            row["false_hits" if not same else "paraphrase_hits"] += 1
            continue  # answered from the cache: nothing new kept
        index.add(scope, vectors[i], str(i), turn_length(texts[i]))
        kept[str(i)] = i
        seen.setdefault(scope, set()).add(intents[i])
    return out


def semantic_report(routes: Sequence[str], texts: Sequence[str], intents: Sequence[str], vectors: np.ndarray,
                    semantic: set[str], thresholds: Sequence[float] = THRESHOLDS) -> dict:
    """route -> [{threshold, requests, false_hits, false_share, paraphrase_hits, paraphrase_share}], and
    the threshold tuned per route: the lowest whose false hits stay within MAX_FALSE_SHARE."""
    table: dict[str, list[dict]] = {r: [] for r in sorted(semantic)}
    for threshold in thresholds:
        for route, row in replay(routes, texts, intents, vectors, semantic, threshold).items():
            table[route].append({"threshold": threshold, **row,
                                 "false_share": round(row["false_hits"] / max(1, row["requests"]), 4),
                                 "paraphrase_share": round(row["paraphrase_hits"] / max(1, row["eligible"]), 4)})
    tuned = {}
    for route, rows in table.items():
        ok = [r["threshold"] for r in rows if r["requests"] and r["false_share"] <= MAX_FALSE_SHARE]
        # None within bounds (or no requests to judge by): 1.0, a turn must embed as the same text.
        tuned[route] = min(ok) if ok else 1.0
    return {"routes": table, "tuned_thresholds": tuned, "max_false_share": MAX_FALSE_SHARE}
