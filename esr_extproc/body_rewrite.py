"""The body a backend gets when it is not the one the client sent: the chosen model and the route's
`set_body` members spliced into the bytes as sent (every other byte the client's), or, where a
filter changed the document itself, the document serialised again."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import NamedTuple

from esr_extproc.json_scan import member_bytes, value_at, with_members
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


class Forwarded(NamedTuple):
    body: bytes | None  # None: the one sent
    # Where the body's `model` value (its opening quote) starts, for a request Envoy may fail over:
    # each attempt's upstream filter writes its own model there (docs/failover.md). None: not asked,
    # or the body has no model the router placed.
    model_at: int | None = None


def forwarded_body(ctx: RequestContext, wire: WireBody, decision: Decision, settings: ServiceSettings) -> Forwarded:
    """The body to forward in place of the one sent. Also on a fallback: "auto" must reach the
    backend as a model it serves."""
    members = set_body(ctx, decision, settings)
    if ctx.body_changed and ctx.unread is None:
        # ASCII escapes keep every string valid JSON (a lone surrogate included).
        if ctx.rewrite_model:
            ctx.body["model"] = decision.model
        ctx.body.update(members)
        if "model" in ctx.body and decision.chain:  # first, where the failover rewrite finds it
            first = {"model": ctx.body["model"], **{k: v for k, v in ctx.body.items() if k != "model"}}
            return Forwarded(json.dumps(first, separators=(",", ":")).encode(), len(b'{"model":'))
        return Forwarded(json.dumps(dict(ctx.body), separators=(",", ":")).encode())
    if ctx.body_changed:
        log.warning("filter changed an unread body; change dropped", extra={"kind": ctx.unread})
    spliced = {name: (_byte_span(ctx.body, name), value) for name, value in members.items()}
    # An unread body is rewritten only where its model was found: a second `model` key would be
    # ambiguous to backends.
    placed = ctx.rewrite_model and (ctx.unread is None or wire.model_span is not None)
    if placed and ctx.requested_model != decision.model:
        spliced["model"] = (wire.model_span, decision.model)
    elif (decision.chain and wire.model_span is not None and ctx.requested_model == decision.model
          and wire.raw[wire.model_span[0]:wire.model_span[1]] != member_bytes(decision.model)):
        # Envoy's failover rewrite finds the model by its bytes: the same name spelled otherwise
        # (escapes) is written as the rewrite spells it, or a retry would leave it as sent.
        spliced["model"] = (wire.model_span, decision.model)
    model_at = None
    if decision.chain and ("model" in spliced or (wire.model_span is not None and ctx.requested_model == decision.model)):
        model_at = value_at(wire.raw, spliced, "model", wire.model_span)
    if spliced:
        return Forwarded(with_members(wire.raw, spliced), model_at)
    return Forwarded(wire.raw if wire.inflated else None, model_at)  # the backend reads the bytes the router read


def _byte_span(body, key: str) -> tuple[int, int] | None:
    """Where a top-level member of the parsed body sits in its raw bytes (None: not there)."""
    span_of = getattr(body, "byte_span", None)
    return span_of(key) if span_of is not None else None
