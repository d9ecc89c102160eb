"""The body a backend gets when it is not the one the client sent: the chosen model and the route's
`set_body` members spliced into the bytes as sent (every other byte the client's), or, where a
filter changed the document itself, the document serialised again."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from esr_extproc.json_scan import with_members
from esr_extproc.serving import ServiceSettings
from filters.context import RequestContext
from router.classifier import Decision

log = logging.getLogger(__name__)


@dataclass
class WireBody:
    """The body as it travels to the backend unless rewritten: transport, not what filters read."""

    raw: bytes  # as the client sent it (inflated, when it came with a content-encoding)
    inflated: bool = False  # raw was inflated: the backend gets it plain
    model_span: tuple[int, int] | None = None  # where its top-level `model` value sits in `raw`


def set_body(ctx: RequestContext, decision: Decision, settings: ServiceSettings) -> dict:
    """The members the route's `set_body` writes: only where the router chose the route (not to a
    pinned model) and read the body."""
    return settings.set_body.get(decision.route, {}) if ctx.rewrite_model and ctx.unread is None else {}


def forwarded_body(ctx: RequestContext, wire: WireBody, decision: Decision, settings: ServiceSettings) -> bytes | None:
    """The body to forward in place of the one sent; None: the one sent. Also on a fallback:
    "auto" must reach the backend as a model it serves."""
    members = set_body(ctx, decision, settings)
    if ctx.body_changed and ctx.unread is None:
        # ASCII escapes keep every string valid JSON (a lone surrogate included).
        if ctx.rewrite_model:
            ctx.body["model"] = decision.model
        ctx.body.update(members)
        return json.dumps(dict(ctx.body), separators=(",", ":")).encode()
    if ctx.body_changed:
        log.warning("filter changed an unread body; change dropped", extra={"kind": ctx.unread})
    spliced = {name: (_byte_span(ctx.body, name), value) for name, value in members.items()}
    # An unread body is rewritten only where its model was found: a second `model` key would be
    # ambiguous to backends.
    if ctx.rewrite_model and ctx.requested_model != decision.model and (
            ctx.unread is None or wire.model_span is not None):
        spliced["model"] = (wire.model_span, decision.model)
    if spliced:
        return with_members(wire.raw, spliced)
    return wire.raw if wire.inflated else None  # the backend reads the bytes the router read


def _byte_span(body, key: str) -> tuple[int, int] | None:
    """Where a top-level member of the parsed body sits in its raw bytes (None: not there)."""
    span_of = getattr(body, "byte_span", None)
    return span_of(key) if span_of is not None else None
