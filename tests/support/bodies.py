"""Request bodies as the server reads them, for tests and benches that key or inspect a body the
way the router does without running one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from esr_extproc.request_body import CacheView, ReadOptions, parse_body
from router.config import RequestsConfig


def cache_view_of(body: Mapping[str, Any], path: str = "/v1/chat/completions",
                  policy: RequestsConfig = RequestsConfig()) -> CacheView:
    """The view the server makes of `body` sent as compact JSON."""
    view = parse_body(json.dumps(body, separators=(",", ":")).encode(), path, ReadOptions(policy, cache=True)).cache
    assert view is not None
    return view
