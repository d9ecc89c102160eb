"""What a cached answer is keyed on. Everything the backend receives that can change its answer is
in the key, so a hit can only be the answer to the same request: the tenant (one never sees
another's answers), the backend model, and every member of the body as forwarded (after the
route's `set_body`, so a pinned request's answer never answers a routed one that adds members)
but the transport's (`stream`, `stream_options`; the backend model stands for `model`), including
the whole conversation, so "Yes, please" in one dialogue never answers it in another.

Members are given as digests of their bytes (esr_extproc.request_body.CacheView, made where the body is
parsed): nothing is decoded to key a request, and two requests match exactly when the backend
would read the same bytes."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

# Members that choose how the answer is delivered, not what it says.
_TRANSPORT = frozenset({"model", "stream", "stream_options"})


def member_digest(value: bytes) -> str:
    """A body member's value as the key holds it: a digest of its bytes as forwarded."""
    return hashlib.blake2b(value, digest_size=16).hexdigest()


def tenant_of(headers: Mapping[str, str], header: str | None) -> str:
    """A hash of the tenant's credential (never the credential itself: keys may be listed)."""
    value = headers.get(header or "authorization", "")
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def request_key(tenant: str, model: str, members: Mapping[str, str]) -> str:
    """The key of a chat completion request routed to `model`, its members as digests."""
    return _hash([tenant, model, sorted((k, v) for k, v in members.items() if k not in _TRANSPORT)])


def scope_key(tenant: str, model: str, members: Mapping[str, str], history: str) -> str:
    """Everything of the key but the last message (`history`: the digest of the messages before
    it): the requests a semantic match may join."""
    rest = sorted((k, v) for k, v in members.items() if k not in _TRANSPORT and k != "messages")
    return _hash(["scope", tenant, model, rest, history])


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


def _hash(value: Any) -> str:
    canonical = json.dumps(value, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()
