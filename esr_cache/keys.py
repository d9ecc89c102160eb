"""What a cached answer is keyed on. Everything a request sends that can change its answer is in
the key, so a hit can only be the answer to the same request: the tenant (one never sees
another's answers), the backend model the request was routed to, every member of the body but the
transport's (`stream`, `stream_options`) and the requested model (the route's model stands for it),
and the whole conversation, so "Yes, please" in one dialogue never answers it in another."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

# Members that choose how the answer is delivered, not what it says.
_TRANSPORT = frozenset({"model", "stream", "stream_options"})


def tenant_of(headers: Mapping[str, str], header: str | None) -> str:
    """A hash of the tenant's credential (never the credential itself: keys may be listed)."""
    value = headers.get(header or "authorization", "")
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def request_key(tenant: str, model: str, body: Mapping[str, Any]) -> str:
    """The key of a chat completion request routed to `model`."""
    members = {k: v for k, v in body.items() if k not in _TRANSPORT}
    canonical = json.dumps([tenant, model, members], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()
