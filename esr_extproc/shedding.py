"""Whether an LLM call is shed at its headers, before its body costs anything: too many calls being
decided (server.max_in_flight), too many of them one client's or one tenant's (server.client_share),
or it waited too long to be read (server.shed_wait_ms). A call holds its slot only from its whole
body's arrival to its answer: an upload still on its way (stalled, or slow on purpose) holds none."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from esr_extproc.serving import ServiceSettings
from esr_extproc.headers import SENT_AT

# The client's address as Envoy saw it (use_remote_address, trusted_hops): set by Envoy on every
# request from outside, a client's own copy dropped first.
CLIENT_ADDRESS = "x-envoy-external-address"


def holders(headers: Mapping[str, str], tenant_header: str | None) -> tuple[str, ...]:
    """Who a call's slot counts against beside the total: its client address and its tenant (the
    configured tenant header, else its credential), each where known: calls without a credential
    are no one tenant. Kept in memory only while the call is decided."""
    address = headers.get(CLIENT_ADDRESS) or headers.get("x-forwarded-for", "").rpartition(",")[2].strip()
    tenant = headers.get(tenant_header or "authorization", "")
    return tuple(key for key, known in (("address:" + address, address), ("tenant:" + tenant, tenant)) if known)


class Admission:
    """The calls a process is deciding: in all, and by holder (holders())."""

    def __init__(self) -> None:
        self.total = 0
        self._held: dict[str, int] = {}

    def shed(self, settings: ServiceSettings, keys: tuple[str, ...], waited: float) -> str | None:
        """Why a call whose headers just came is shed (a reason, as the request counter names it), or None.
        `waited`: its waited_s, read once by the caller (it also sets the budget's start)."""
        limit = settings.server.max_in_flight
        if limit and self.total >= limit:
            return "fallback_overload"
        if settings.shed_wait_s and waited > settings.shed_wait_s:
            return "fallback_overload"
        share = settings.server.client_share
        if limit and share < 1.0:
            most = max(1, math.floor(share * limit))
            if any(self._held.get(k, 0) >= most for k in keys):
                return "fallback_client_share"
        return None

    def admit(self, keys: tuple[str, ...]) -> None:
        self.total += 1
        for k in keys:
            self._held[k] = self._held.get(k, 0) + 1

    def release(self, keys: tuple[str, ...]) -> None:
        self.total -= 1
        for k in keys:
            n = self._held[k] - 1
            if n:
                self._held[k] = n
            else:
                del self._held[k]


def waited_s(headers: dict[str, str]) -> float:
    """How long the request waited between Envoy sending it on and the router reading it (the
    rendered config's stamp, headers.SENT_AT; one host's clock, the sidecar's); 0 where unknown."""
    try:
        return max(0.0, time.time() - int(headers[SENT_AT]) / 1e6)
    except (KeyError, ValueError):
        return 0.0
