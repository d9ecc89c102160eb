"""Reads a request body once, within its deadline's reach: the strict scan (json_scan), the member
names backends decode into typed fields, and from the same decoded object what routing, the guard,
rules and the response cache read of it. Runs inline or in the body parser's worker process
(body_parser); what crosses back from the worker is a small BodySummary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from esr_cache.exchange import CacheView
from esr_cache.keys import last_user_text, member_digest
from esr_cache.semantic import embedded_whole
from esr_extproc.json_scan import (BadBody, DuplicateKey, LazyObject, byte_span, decode_value, duplicate_key,
                                   element_starts, fold, top_level, utf8_text)
from router.config import RequestsConfig
from router.guard_pieces import as_read, guard_pieces
from router.llm_body import conversation_of, lax_bool, request_facts, texts_to_route, well_formed
from router.rules import RequestFacts

_DEFAULT_POLICY = RequestsConfig()


@dataclass
class ParsedBody:
    data: LazyObject  # members decode when first read
    model: str | None
    turns: tuple[str, ...]  # what is routed on, oldest first; empty: no user text to route on
    model_span: tuple[int, int] | None = None  # bytes of the top-level `model` value in the raw body
    guard: tuple[str, ...] = ()  # guard_pieces, when asked for
    facts: RequestFacts | None = None  # request_facts, when asked for
    truncated: bool = False  # a routed text is estimated longer than the encoder's window (prompt_max_tokens)
    cache: CacheView | None = None  # when asked for


def cache_view(text: str, data: LazyObject, window_tokens: int) -> CacheView:
    spans = data.spans
    members = {k: member_digest(text[s:e].encode("utf-8", "surrogatepass")) for k, (s, e) in spans.items()}  # type: ignore[misc]
    history = last_turn = None
    messages = spans.get("messages")
    if messages is not None and isinstance(data.get("messages"), list):
        starts = element_starts(text, messages[0])
        history = member_digest(text[messages[0]:starts[-1] if starts else messages[1]].encode("utf-8", "surrogatepass"))
        turn = last_user_text(data)
        if turn is not None and embedded_whole(turn, window_tokens):
            last_turn = well_formed(turn)
    return CacheView(members, history, last_turn, lax_bool(data.get("stream")) is True)  # as the backend reads it (request_facts)


# Member names of the objects backends decode into typed fields (the request, its messages and
# items, content parts, tool calls, tool definitions): where a case-insensitive reader would take
# "Messages" or "ROLE" for the member the router reads under its exact name.
READ_NAMES = frozenset({
    "model", "messages", "prompt", "input", "instructions", "system", "tools", "functions", "stream",
    "role", "content", "type", "text", "name", "tool_calls", "function", "arguments", "description",
    "parameters", "input_schema", "output", "thinking", "reasoning_content", "reasoning", "summary", "refusal",
    "tool_call_id", "tool_use_id",
})


def _exact_names(obj: Any) -> None:
    """BadBody case_variant_key when a member of `obj` (a dict) is a read name in another case."""
    if isinstance(obj, dict):
        for key in obj:
            if key not in READ_NAMES and fold(key) in READ_NAMES:
                raise BadBody("case_variant_key", f"member {key[:64]!r} is {fold(key)!r} in another case: "
                                                  "send it in lower case")


def _check_names(data: Mapping[str, Any], path: str, tools: bool) -> None:
    """The request's own members and those of every message (item), its content parts and tool
    calls; with `tools` (the guard reads them), the tool definitions too."""
    _exact_names(dict.fromkeys(data))
    items = data.get("input") if path.endswith("/responses") else data.get("messages")
    for m in items if isinstance(items, list) else ():
        _exact_names(m)
        if isinstance(m, dict):
            for member in ("content", "tool_calls"):
                parts = m.get(member)
                for part in parts if isinstance(parts, list) else ():
                    _exact_names(part)
                    if isinstance(part, dict):
                        _exact_names(part.get("function"))
    for key in ("tools", "functions") if tools else ():
        offered = data.get(key)
        for tool in offered if isinstance(offered, list) else ():
            _exact_names(tool)
            if isinstance(tool, dict):
                _exact_names(tool.get("function"))


@dataclass(frozen=True)
class ReadOptions:
    """What a body is read for, beyond its model and the turns to route on."""

    policy: RequestsConfig = _DEFAULT_POLICY  # which turns, how much of them (requests.*)
    max_turns: int = 1  # the conversation's user turns read (conversation.turns_read)
    guard: bool = False  # also the guard's pieces
    facts: bool = False  # also what rules read (request_facts)
    cache: bool = False  # also the response cache's view (CacheView)


def parse_body(raw: bytes, path: str, read: ReadOptions = ReadOptions(), deadline: float | None = None) -> ParsedBody:
    """Strict UTF-8, one JSON object, no repeated key anywhere (every member is checked here, so
    no component reading one later meets a repeat); members are kept decoded only once read (see
    LazyObject); what else is read, by `read`. Past `deadline` (time.monotonic()), OutOfTime."""
    policy, max_turns, guard, facts, cache = read.policy, read.max_turns, read.guard, read.facts, read.cache
    text = utf8_text(raw)
    try:
        decoded: dict[str, Any] = {}
        spans = top_level(text, deadline, decoded)
        data = LazyObject(text, spans, decoded)
        model = data.get("model")
        if model is not None and not isinstance(model, str):
            raise BadBody("bad_model", "model is not a string")
        _check_names(data, path, tools=guard)
        turns, truncated = texts_to_route(*conversation_of(data, path, policy.harness_tags), policy, max_turns)
        turns = tuple(well_formed(t) for t in turns)
        pieces = tuple(dict.fromkeys(as_read(p) for p in guard_pieces(data, path, policy))) if guard else ()
        measured = request_facts(data, path) if facts else None
        for key, value_span in spans.items():  # checked and dropped: decoded again if read
            # Only an object can repeat a key: a member with none (a string, numbers, an array of
            # them) is passed at memchr speed, not built.
            if not data.decoded(key) and value_span is not None and text.find("{", *value_span) >= 0:
                decode_value(text, *value_span)
        view = cache_view(text, data, policy.prompt_max_tokens) if cache else None
    except DuplicateKey as dup:
        raise duplicate_key(dup) from None
    except BadBody:
        raise
    except (ValueError, RecursionError):
        raise BadBody("not_json", "body is not JSON") from None
    span = spans.get("model")
    model_span = byte_span(text, *span) if span is not None else None
    return ParsedBody(data, model, turns, model_span, pieces, measured, truncated, view)


@dataclass
class BodySummary:
    """What a worker process that parsed a body sends back: small, whatever the body's size."""

    model: str | None
    turns: tuple[str, ...]
    model_span: tuple[int, int] | None
    spans: dict[str, tuple[int, int] | None]
    guard: tuple[str, ...]
    facts: RequestFacts | None
    truncated: bool
    cache: CacheView | None


def summarize(raw: bytes, path: str, read: ReadOptions, deadline: float | None = None) -> BodySummary:
    parsed = parse_body(raw, path, read, deadline)
    return BodySummary(parsed.model, parsed.turns, parsed.model_span, parsed.data.spans, parsed.guard, parsed.facts,
                       parsed.truncated, parsed.cache)


def from_summary(raw: bytes, summary: BodySummary) -> ParsedBody:
    return ParsedBody(LazyObject(raw, dict(summary.spans)), summary.model, summary.turns, summary.model_span,
                      summary.guard, summary.facts, summary.truncated, summary.cache)
