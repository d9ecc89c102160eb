"""Property tests: the body parser and the ext_proc service take anything without breaking."""

from __future__ import annotations

import asyncio
import json

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filters.request_body import BadBody, parse_body
from router.config import RequestsConfig
from tests.test_service import Harness

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
        parsed = parse_body(raw, path, RequestsConfig(prompt_turns=turns, include_system=system))
    except BadBody as bad:
        assert bad.kind in {"empty", "not_json", "not_utf8", "not_object", "bad_model"}
        return
    assert isinstance(parsed.data, dict)
    assert parsed.prompt is None or (isinstance(parsed.prompt, str) and parsed.prompt.strip())


def header_messages():
    pairs = st.lists(st.tuples(st.sampled_from([":path", ":method", "content-type", "x-selected-model", "x-any"]),
                               st.text(max_size=30)), max_size=5)
    return st.builds(
        lambda hs, eos: pb.ProcessingRequest(request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs]),
            end_of_stream=eos)),
        pairs, st.booleans())


def body_messages():
    return st.builds(lambda b, eos: pb.ProcessingRequest(request_body=pb.HttpBody(body=b, end_of_stream=eos)),
                     bodies, st.booleans())


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
