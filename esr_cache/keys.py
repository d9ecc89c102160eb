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
    return _hash([tenant, model, {k: v for k, v in body.items() if k not in _TRANSPORT}])


def last_user_text(body: Mapping[str, Any]) -> str | None:
    """The text of the request's last message when it is the user's, in plain string content (what
    semantic matching compares); None otherwise (exact matching only)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "user" or not isinstance(content, str) or set(last) - {"role", "content"}:
        return None
    return content


def scope_key(tenant: str, model: str, body: Mapping[str, Any]) -> str:
    """Everything of the key but the last user turn's text: the requests a semantic match may join."""
    members = {k: v for k, v in body.items() if k not in _TRANSPORT}
    members["messages"] = list(members["messages"])[:-1]
    return _hash(["scope", tenant, model, members])


def _hash(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()
