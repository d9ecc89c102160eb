"""Whether an LLM call is shed at its headers, before its body costs anything: too many admitted calls
unanswered (server.max_in_flight), or it waited too long to be read (server.shed_wait_ms). A shed
call takes the gateway's own route; only behind a gateway that reads the pinned model itself."""

from __future__ import annotations

import time

from esr_extproc.serving import ServiceSettings
from esr_extproc.headers import SENT_AT


def overloaded(settings: ServiceSettings, in_flight: int, waited: float) -> bool:
    """`waited`: the request's waited_s, read once by the caller (it also sets the budget's start)."""
    limit = settings.server.max_in_flight
    return bool(limit and in_flight >= limit) or bool(settings.shed_wait_s and waited > settings.shed_wait_s)


def waited_s(headers: dict[str, str]) -> float:
    """How long the request waited between Envoy sending it on and the router reading it (the
    rendered config's stamp, headers.SENT_AT; one host's clock, the sidecar's); 0 where unknown."""
    try:
        return max(0.0, time.time() - int(headers[SENT_AT]) / 1e6)
    except (KeyError, ValueError):
        return 0.0
