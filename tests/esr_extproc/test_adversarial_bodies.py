"""Bodies shaped to cost the most to parse: the work grows linearly with size, only a body cheap in
both bytes and structure is parsed on the event loop, and a parse never outlives its deadline."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.frontend.adversarial_parse import SHAPES, cpu_ms
from esr_extproc.body_parser import BodyParser, ParseTimeout
from esr_extproc.json_scan import MAX_DEPTH, BadBody, scan_unread
from esr_extproc.request_body import ReadOptions, parse_body
from router.config import RequestsConfig

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_parse_work_grows_linearly_with_size(shape):
    # 16x the bytes may cost at most ~3x as much per byte (cache effects), far from the 16x per
    # byte of a quadratic scan: finding the repeat among 34,000 keys took 45.6 s before.
    small, large = SHAPES[shape](32 * 1024), SHAPES[shape](512 * 1024)
    for fn in (lambda raw: parse_body(raw, CHAT, ReadOptions(RequestsConfig(), 8)), scan_unread):
        per_byte_small = max(cpu_ms(fn, small), 0.2) / len(small)
        per_byte_large = cpu_ms(fn, large) / len(large)
        assert per_byte_large < 3 * per_byte_small, (shape, per_byte_small, per_byte_large)


def test_a_repeated_key_is_named_whatever_the_object_size():
    raw = SHAPES["many_keys_one_repeated"](256 * 1024)
    with pytest.raises(BadBody) as bad:
        parse_body(raw, CHAT)
    assert bad.value.kind == "duplicate_key" and "'k0'" in str(bad.value)


def test_nesting_past_the_limit_is_refused_before_any_decoding():
    ok = b'{"model":"auto","x":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
    assert parse_body(ok, CHAT).model == "auto"
    for deep in (b'{"x":' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}",
                 b'{"x":' + b'{"a":' * 400_000 + b"1" + b"}" * 400_000 + b"}"):
        for fn in (lambda raw: parse_body(raw, CHAT), scan_unread):
            with pytest.raises(BadBody) as bad:
                fn(deep)
            assert bad.value.kind == "too_deep"


def test_a_model_repeated_after_megabytes_of_padding_is_found():
    # Backends that keep the last copy would serve `no-such-model`; the router read the first.
    padding = "x" * (4 * 1024 * 1024 + 100 * 1024)
    raw = ('{"model":"general-model","pad":"%s","messages":[],"model":"no-such-model"}' % padding).encode()
    with pytest.raises(BadBody) as bad:
        scan_unread(raw)
    assert bad.value.kind == "duplicate_key"
    model, span = scan_unread(('{"model":"general-model","pad":"%s"}' % padding).encode())
    assert model == "general-model" and span == (9, 24)
    assert scan_unread(b"[1,2]") == (None, None) and scan_unread(b"not json") == (None, None)


def test_only_bodies_cheap_in_bytes_and_structure_are_parsed_on_the_event_loop():
    parser = BodyParser()
    ordinary = b'{"model":"auto","messages":[{"role":"system","content":"be brief"},' \
               b'{"role":"user","content":"' + b"why is the sky blue? " * 1000 + b'"}]}'
    assert parser.inline(ordinary)
    for shape, make in SHAPES.items():
        assert not parser.inline(make(64 * 1024)), shape


@pytest.mark.processes
def test_a_parse_that_outlives_its_deadline_falls_back_and_frees_the_worker_at_once():
    slow = SHAPES["empty_objects"](4 * 1024 * 1024)  # ~2 s of parsing
    ordinary_large = SHAPES["many_turns"](128 * 1024)

    async def main():
        parser = BodyParser()
        lags = []

        async def ticker():
            while True:
                before = time.monotonic()
                await asyncio.sleep(0.01)
                lags.append(time.monotonic() - before - 0.01)

        try:
            first = await parser.start()
            tick = asyncio.create_task(ticker())
            with pytest.raises(ParseTimeout):
                await parser.parse(slow, CHAT, ReadOptions(RequestsConfig(), 8), deadline=time.monotonic() + 0.3)
            # The scan stopped itself at the deadline: the next large body does not queue behind the
            # ~1.7 s of work left (its own deadline would pass first), and the worker lives on.
            parsed = await parser.parse(ordinary_large, CHAT, ReadOptions(RequestsConfig(), 8), deadline=time.monotonic() + 1.5)
            tick.cancel()
            assert parsed.turns and parsed.turns[-1] == "a"
            assert await parser.start() == first
            assert max(lags) < 0.5, max(lags)  # the loop was never held by the ~2 s body
        finally:
            parser.close()

    asyncio.run(main())
