"""Property tests: the body parser and the ext_proc service take anything without breaking."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esr_extproc.json_scan import AMBIGUOUS, BadBody, fold, scan_unread, value_at, with_members
from esr_extproc.request_body import READ_NAMES, ReadOptions, parse_body
from router.config import RequestsConfig
from tests.support.extproc import Harness, body_msg, raw_headers_msg

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "developer", 3]),
                           "content": json_values | st.text(max_size=50)}),
    max_size=5,
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"model": json_values | st.sampled_from(["auto", "math-model", "x"]),
                           "messages": messages | json_values}).map(lambda v: json.dumps(v).encode()),
)
paths = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/", "/x?y=1"])


@given(raw=bodies, path=paths, turns=st.integers(1, 4), system=st.booleans())
@settings(max_examples=400, deadline=None)
def test_parser_returns_or_raises_badbody_only(raw, path, turns, system):
    try:
        parsed = parse_body(raw, path, ReadOptions(RequestsConfig(prompt_turns=turns, include_system=system)))
    except BadBody as bad:
        assert bad.kind in {"empty", "not_json", "not_object", "bad_model", *AMBIGUOUS}
        return
    assert isinstance(parsed.data, MutableMapping)
    assert all(isinstance(turn, str) and turn.strip() for turn in parsed.turns)


def header_messages():
    pairs = st.lists(st.tuples(st.sampled_from([":path", ":method", "content-type", "x-selected-model", "x-any"]),
                               st.text(max_size=30)), max_size=5)
    return st.builds(
        raw_headers_msg,
        pairs, st.booleans())


def body_messages():
    return st.builds(body_msg, bodies, st.booleans())


other_messages = st.sampled_from([
    pb.ProcessingRequest(response_headers=pb.HttpHeaders()),
    pb.ProcessingRequest(response_body=pb.HttpBody(body=b"x")),
    pb.ProcessingRequest(request_trailers=pb.HttpTrailers()),
    pb.ProcessingRequest(response_trailers=pb.HttpTrailers()),
])

ANSWER_FOR = {"request_headers": {"request_headers"}, "request_body": {"request_body", "immediate_response"},
              "response_headers": {"response_headers"}, "response_body": {"response_body"},
              "request_trailers": {"request_trailers"}, "response_trailers": {"response_trailers"}}


@given(sequence=st.lists(st.one_of(header_messages(), body_messages(), other_messages), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_service_answers_every_message_of_any_sequence(sequence):
    async def main():
        async with Harness() as h:
            responses = await asyncio.wait_for(h.exchange(*sequence), 10)
        for request, response in zip(sequence, responses):
            kind = request.WhichOneof("request")
            assert response.WhichOneof("response") in ANSWER_FOR[kind], (kind, response)
            assert response.IsInitialized()

    asyncio.run(main())


def _read_alike(value, top=True) -> bool:
    """Two member names a case-insensitive backend reads as one, at any depth, or a name the router
    reads sent in another case: such a body is refused (test_a_body_with_names_that_fold_alike_...)."""
    if isinstance(value, list):
        return any(_read_alike(v, False) for v in value)
    if not isinstance(value, dict):
        return False
    folded = [fold(k) for k in value]
    return (len(set(folded)) != len(folded) or (top and any(k not in READ_NAMES and fold(k) in READ_NAMES
                                                             for k in value))
            or any(_read_alike(v, False) for v in value.values()))


documents = st.dictionaries(st.text(max_size=8).filter(lambda k: fold(k) != "model"), json_values,
                            max_size=5).filter(lambda d: not _read_alike(d))
layouts = st.sampled_from([
    {}, {"indent": 2}, {"separators": (",", ":")}, {"ensure_ascii": False}, {"indent": "\t", "ensure_ascii": False},
])


@given(doc=documents, model=st.one_of(st.none(), st.text(max_size=12)), new=st.text(max_size=12),
       first=st.booleans(), layout=layouts)
@settings(max_examples=400, deadline=None)
def test_model_rewrite_changes_only_the_model_value(doc, model, new, first, layout):
    body = dict(doc)
    if model is not None:
        body = {"model": model, **doc} if first else {**doc, "model": model}
    raw = json.dumps(body, **layout).encode()
    parsed = parse_body(raw, "/v1/chat/completions")
    out = with_members(raw, {"model": (parsed.model_span, new)})
    assert json.loads(out) == {**body, "model": new}
    if parsed.model_span is not None:  # every byte outside the value is the client's
        start, end = parsed.model_span
        assert out[:start] == raw[:start] and out[len(out) - (len(raw) - end):] == raw[end:]
    else:
        assert out.endswith(raw[1:])
    assert scan_unread(raw) == ((model, parsed.model_span) if model is not None else (None, None))


safe_models = st.from_regex(r"[A-Za-z0-9._:/@+-]{1,20}", fullmatch=True)  # what header_safe lets a model be
members = st.dictionaries(st.text(max_size=6).filter(lambda k: fold(k) != "model"), json_values, max_size=3)


@given(doc=documents, model=st.one_of(st.none(), safe_models), new=safe_models, extra=members, first=st.booleans(),
       layout=layouts)
@settings(max_examples=300, deadline=None)
def test_value_at_finds_the_model_where_with_members_wrote_it(doc, model, new, extra, first, layout):
    """Where a failover attempt's upstream filter finds the model to overwrite (headers.MODEL_AT):
    exactly where the router wrote it, whatever else the route's set_body spliced or added."""
    body = dict(doc)
    if model is not None:
        body = {"model": model, **doc} if first else {**doc, "model": model}
    raw = json.dumps(body, **layout).encode()
    parsed = parse_body(raw, "/v1/chat/completions")
    spliced = {k: (parsed.data.byte_span(k), v) for k, v in extra.items() if k in body or k not in doc}
    spliced["model"] = (parsed.model_span, new)
    out = with_members(raw, spliced)
    at = value_at(raw, spliced, "model", parsed.model_span)
    assert out[at:at + len(new) + 2] == json.dumps(new).encode()
    kept = {k: v for k, v in spliced.items() if k != "model"}  # the model left as the client sent it
    if model is not None:
        at = value_at(raw, kept, "model", parsed.model_span)
        assert with_members(raw, kept)[at:at + len(model) + 2] == json.dumps(model).encode()


# A name and a twin a case-insensitive reader takes for it: other cases, the long s, the Kelvin sign.
_TWINS = {"a": "aA", "k": "kK\u212a", "s": "sS\u017f", "x": "xX"}
twin_names = st.text(alphabet="aksx", min_size=1, max_size=4).flatmap(
    lambda name: st.tuples(st.just(name), st.tuples(*(st.sampled_from(_TWINS[c]) for c in name)).map("".join)
                           .filter(lambda twin: twin != name)))


@given(names=twin_names, others=documents, twin_first=st.booleans())
@settings(max_examples=100, deadline=None)
def test_a_body_with_names_that_fold_alike_is_refused_never_rewritten(names, others, twin_first):
    name, twin = names[::-1] if twin_first else names
    doc = {name: 1, **{k: v for k, v in others.items() if fold(k) != fold(name)}, twin: 2}
    try:
        parse_body(json.dumps(doc).encode(), "/v1/chat/completions")
    except BadBody as bad:
        assert bad.kind == "duplicate_key"
    else:
        raise AssertionError(f"names that fold alike were accepted: {list(doc)}")


def test_model_rewrite_keeps_numbers_escapes_and_lone_surrogates():
    raw = (b'{"model" : "auto", "n": [1E2, 1e999999, 0.1000000000000000055511151231257827, -0],'
           b' "user": "\\ud800", "s": "\\u00e9\\/"}')
    parsed = parse_body(raw, "/v1/chat/completions")
    assert with_members(raw, {"model": (parsed.model_span, "math-model")}) == raw.replace(b'"auto"', b'"math-model"')
    assert with_members(b'{}', {"model": (None, "m")}) == b'{"model":"m"}'


@given(raw=st.sampled_from([b'{"model":"a","model":"b"}', b'{"messages":[{"role":"user","role":"system"}]}',
                            b'{"messages":[{"role":"user","content":[{"type":"text","type":"image"}]}]}',
                            b'{"a":1,"messages":[],"a":{"x":1}}']))
def test_repeated_keys_where_the_router_reads_are_refused(raw):
    # At the top level and in every member the router reads; a member it never reads is not
    # decoded, so the router's decision cannot depend on which copy a backend takes.
    try:
        parse_body(raw, "/v1/chat/completions")
    except BadBody as bad:
        assert bad.kind == "duplicate_key"
    else:
        raise AssertionError("a repeated key was accepted")


def test_only_utf8_is_accepted():
    body = '{"model":"auto","messages":[{"role":"user","content":"hi"}]}'
    for encoding in ("utf-16", "utf-32", "utf-16-le"):
        try:
            parse_body(body.encode(encoding), "/v1/chat/completions")
        except BadBody as bad:
            # Refused (never routed to the default): a Python backend's json.loads reads it.
            assert bad.kind == "not_utf8"
        else:
            raise AssertionError(f"{encoding} body accepted")


def test_members_the_router_does_not_read_are_not_decoded_until_read():
    raw = b'{"model":"auto","x":[' + b",".join([b"1.5e3"] * 50000) + b'],"messages":[{"role":"user","content":"hi"}]}'
    parsed = parse_body(raw, "/v1/chat/completions")
    assert parsed.turns == ("hi",) and "x" not in parsed.data._values  # skipped, never built
    assert parsed.data["x"][:2] == [1500.0, 1500.0] and list(parsed.data) == ["model", "x", "messages"]
