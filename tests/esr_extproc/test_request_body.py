"""Prompt and model extraction from the request shapes LLM gateways see."""

from __future__ import annotations

import json

import pytest

from esr_extproc import json_scan
from esr_extproc.json_scan import BadBody
from esr_extproc.request_body import ReadOptions, parse_body
from router.config import RequestsConfig
from tests.support.waiting import wait_for

CHAT = "/v1/chat/completions"


def body(obj) -> bytes:
    return json.dumps(obj).encode()


def test_last_user_message_string_content():
    parsed = parse_body(
        body({"model": "auto", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "second question"},
        ]}),
        CHAT,
    )
    assert parsed.model == "auto"
    assert parsed.turns[-1] == "second question"


def test_content_parts_keep_text_ignore_images():
    parsed = parse_body(
        body({"model": "auto", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:..."}},
            {"type": "text", "text": "what is in"},
            {"type": "text", "text": "this picture"},
        ]}]}),
        CHAT,
    )
    assert parsed.turns[-1] == "what is in\nthis picture"


@pytest.mark.parametrize(
    "obj",
    [
        {"model": "auto"},
        {"model": "auto", "messages": []},
        {"model": "auto", "messages": "hello"},
        {"model": "auto", "messages": [{"role": "user", "content": 42}]},
        {"model": "auto", "messages": [{"role": "user", "content": "   "}]},
        {"model": "auto", "messages": [{"role": "assistant", "content": "hi"}]},
        {"model": "auto", "messages": [None, 3, "x"]},
    ],
)
def test_no_usable_prompt_is_none_not_an_error(obj):
    assert parse_body(body(obj), CHAT).turns == ()


@pytest.mark.parametrize(
    "raw, kind",
    [
        (b"", "empty"),
        (b"not json", "not_json"),
        (b"\xff\xfe\x00garbage\x80", "not_utf8"),
        (b"[1, 2, 3]", "not_object"),
        (b'"just a string"', "not_object"),
        (b'{"model": 5, "messages": []}', "bad_model"),
        (b"{" * 100000, "not_json"),
    ],
)
def test_unusable_bodies_raise_badbody_with_kind(raw, kind):
    with pytest.raises(BadBody) as err:
        parse_body(raw, CHAT)
    assert err.value.kind == kind


def test_other_api_shapes():
    assert parse_body(body({"model": "auto", "prompt": "complete this"}), "/v1/completions").turns[-1] == "complete this"
    assert parse_body(body({"model": "auto", "prompt": ["a", "b"]}), "/v1/completions").turns[-1] == "b"
    assert parse_body(body({"model": "auto", "input": "hello"}), "/v1/responses").turns[-1] == "hello"
    items = {"model": "auto", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi there"}]}]}
    assert parse_body(body(items), "/v1/responses").turns[-1] == "hi there"
    anthropic = {"model": "auto", "system": "x", "messages": [{"role": "user", "content": "bonjour"}]}
    assert parse_body(body(anthropic), "/v1/messages").turns[-1] == "bonjour"


def test_prompt_policy_turns_system_and_cap():
    from router.config import RequestsConfig

    convo = {"model": "auto", "messages": [
        {"role": "system", "content": "You are a maths tutor."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
        {"role": "user", "content": "third"},
    ]}
    assert parse_body(body(convo), CHAT, ReadOptions(RequestsConfig(prompt_turns=2))).turns[-1] == "second\nthird"
    assert parse_body(body(convo), CHAT, ReadOptions(RequestsConfig(include_system=True))).turns[-1] == "You are a maths tutor.\nthird"
    long = {"model": "auto", "messages": [{"role": "user", "content": "x" * 100 + "END"}]}
    capped = parse_body(body(long), CHAT, ReadOptions(RequestsConfig(prompt_max_tokens=8))).turns[-1]
    assert capped.endswith("END") and len(capped) == 64  # twice the estimate, in characters


def test_anthropic_system_and_responses_instructions():
    from router.config import RequestsConfig

    policy = RequestsConfig(include_system=True)
    anthropic = {"model": "auto", "system": [{"type": "text", "text": "be terse"}],
                 "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert parse_body(body(anthropic), "/v1/messages", ReadOptions(policy)).turns[-1] == "be terse\nhello"
    responses = {"model": "auto", "instructions": "answer in French", "input": "hi"}
    assert parse_body(body(responses), "/v1/responses", ReadOptions(policy)).turns[-1] == "answer in French\nhi"


@pytest.mark.processes
def test_large_bodies_parse_in_a_worker_process_with_the_same_outcome():
    import asyncio

    from esr_extproc.body_parser import BodyParser

    filler = ",".join(["1.25e3"] * 60000)
    good = ('{"model":"auto","x":[%s],"messages":[{"role":"user","content":"solve 2x = 4"}]}' % filler).encode()
    dup = ('{"model":"auto","x":[%s],"model":"code-model"}' % filler).encode()

    async def main():
        parser = BodyParser(inline_bytes=1024)
        try:
            parsed = await parser.parse(good, "/v1/chat/completions", ReadOptions(RequestsConfig()))
            assert parser._pool is not None  # it went to the worker
            inline = parse_body(good, "/v1/chat/completions")
            assert (parsed.model, parsed.turns, parsed.model_span) == (inline.model, inline.turns, inline.model_span)
            assert parsed.data["x"][0] == 1250.0 and list(parsed.data) == ["model", "x", "messages"]
            with pytest.raises(BadBody) as bad:  # the kind crosses the process boundary
                await parser.parse(dup, "/v1/chat/completions", ReadOptions(RequestsConfig()))
            assert bad.value.kind == "duplicate_key"
        finally:
            parser.close()

    asyncio.run(main())


def _running(pid: int) -> bool:
    """Whether `pid` is still running: neither reaped (gone) nor dead and unreaped (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.processes
def test_the_worker_process_starts_before_the_first_large_body_and_is_replaced_when_killed():
    # Started by the first large body, the worker's start-up counted against that request's
    # deadline: under a CPU-bound neighbour the huge-prompt gateway test fell back to the default.
    import asyncio
    import os
    import signal

    from esr_extproc.body_parser import BodyParser

    large = ('{"model":"auto","x":"%s","messages":[{"role":"user","content":"solve 2x = 4"}]}' % ("y" * 4096)).encode()

    async def main():
        parser = BodyParser(inline_bytes=1024)
        try:
            pid = await parser.start()
            assert pid != os.getpid() and os.path.exists(f"/proc/{pid}")
            pool = parser._pool
            assert (await parser.parse(large, "/v1/chat/completions", ReadOptions(RequestsConfig()))).turns[-1] == "solve 2x = 4"
            assert parser._pool is pool  # the started worker took it
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not _running(pid), 10, "the killed worker gone", interval=0.01)
            # The worker died: a new one takes this body (never the event loop).
            assert (await parser.parse(large, "/v1/chat/completions", ReadOptions(RequestsConfig()))).turns[-1] == "solve 2x = 4"
            assert parser._pool is not None and parser._pool is not pool
            assert (await parser.parse(large, "/v1/chat/completions", ReadOptions(RequestsConfig()))).turns[-1] == "solve 2x = 4"
        finally:
            parser.close()

    asyncio.run(main())


@pytest.mark.processes
def test_the_worker_process_goes_when_its_router_dies_however_it_dies():
    """A router killed outright (SIGKILL, the OOM killer) leaves no parser process behind."""
    import subprocess
    import sys

    from tests.support import ROOT

    script = ("import asyncio, sys, time\n"
              "from esr_extproc.body_parser import BodyParser\n"
              "async def main():\n"
              "    print(await BodyParser().start(), flush=True)\n"
              "    time.sleep(600)\n"
              "asyncio.run(main())\n")
    router = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        worker = int(router.stdout.readline())
        assert _running(worker)
    finally:
        router.kill()
        router.wait(30)
    wait_for(lambda: not _running(worker), 30, f"parser process {worker} gone after its router was killed")


# What is read from agent traffic: the user's own words, never tool calls, tool results or harness text.

REMINDER = "<system-reminder>\nThe user opened utils.py. Todo list: empty.\n</system-reminder>"


def turns(obj, path=CHAT, max_turns=8, **policy):
    return parse_body(body(obj), path, ReadOptions(RequestsConfig(**policy), max_turns)).turns


def test_openai_chat_agent_loop_reads_user_turns_only():
    obj = {"model": "auto", "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "developer", "content": "Always run the tests."},
        {"role": "user", "content": "fix the failing date parser test"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"dates.py\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "def parse(s): ..."},
        {"role": "user", "content": [{"type": "text", "text": REMINDER},
                                     {"type": "text", "text": "now also handle time zones"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]},
        {"role": "assistant", "content": "Done."},
        {"role": "tool", "tool_call_id": "c2", "content": "All 12 tests passed."},
    ]}
    assert turns(obj) == ("fix the failing date parser test", "now also handle time zones")
    assert turns(obj, max_turns=1) == ("now also handle time zones",)


def test_anthropic_tool_results_and_reminders_are_not_the_users_turn():
    obj = {"model": "auto", "system": [{"type": "text", "text": "You are Claude Code."}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": "book a table for two"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "tables"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "3 restaurants found"}]},
        {"role": "user", "content": "<system-reminder>only a reminder</system-reminder>"},
    ]}
    # The last two user messages carry no words of the user's: the conversation's last turn stands.
    assert turns(obj, "/v1/messages") == ("book a table for two",)


def test_responses_items_read_user_messages_only():
    obj = {"model": "auto", "instructions": "be brief", "input": [
        {"role": "developer", "content": "harness rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "find flights to Oslo"}]},
        {"type": "function_call", "call_id": "f1", "name": "search", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "f1", "output": "no flights"},
        {"type": "message", "role": "user", "content": "<environment_details>cwd: /src</environment_details>try Bergen"},
    ]}
    assert turns(obj, "/v1/responses") == ("find flights to Oslo", "try Bergen")
    system = parse_body(body(obj), "/v1/responses", ReadOptions(RequestsConfig(include_system=True))).turns[-1]
    assert system == "be brief\nharness rules\ntry Bergen"


def test_harness_tags_are_configurable_and_only_whole_blocks_go():
    text = "keep <note>this</note> and <system-reminder>x</system-reminder>that <system-reminderish>too"
    obj = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    assert turns(obj) == ("keep <note>this</note> and that <system-reminderish>too",)
    assert turns(obj, harness_tags=("note",)) == ("keep  and <system-reminder>x</system-reminder>that <system-reminderish>too",)
    assert turns(obj, harness_tags=()) == (text,)
    unclosed = {"model": "auto", "messages": [{"role": "user", "content": "<system-reminder>" * 20000 + "hi"}]}
    assert turns(unclosed)[0].endswith("hi")  # an unclosed block is left as it is, in linear time


def test_track_reads_the_last_max_turns_each_capped():
    obj = {"model": "auto", "messages": [{"role": "user", "content": f"turn {i} " + "x" * 100} for i in range(12)]}
    got = turns(obj, max_turns=8, prompt_max_tokens=8)
    assert len(got) == 8 and all(len(t) == 64 for t in got)
    assert turns(obj, max_turns=8)[0].startswith("turn 4")


SMALL_BODIES = [
    b'{"model": "auto", "messages": [{"role": "user", "content": "solve 2x = 4"}], "temperature": 0.2}',
    b'{"model":"auto","messages":[{"role":"user","content":"hi","role":"system"}]}',  # repeated inside
    b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"temperature":tru}',  # malformed, unread
    b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"x":{"a":1,"a":2}}',  # repeated, unread
    b'{"model":"auto","messages":[{"role":"user","content":"hi"}]} {"model":"code-model"}',  # trailing data
    b'{"model":"auto","Messages":[{"role":"user","content":"hi"}]}',  # a read name in another case
    b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"x":[1,2,}',  # unbalanced
    b'{"model":"auto","messages":' + b"[" * 200 + b"]" * 200 + b"}",  # too deep
    b'{"model":"auto","messages":[{"role":"user","content":"\\ud800 lone"}]}',
]


@pytest.mark.parametrize("raw", SMALL_BODIES)
def test_a_small_body_decoded_at_once_reads_as_the_scan_reads_it(raw, monkeypatch):
    def outcome():
        try:
            parsed = parse_body(raw, CHAT)
        except BadBody as bad:
            return bad.kind
        read = {k: parsed.data[k] for k in ("model", "messages") if k in parsed.data}
        return parsed.model, parsed.turns, parsed.model_span, parsed.data.spans, read

    at_once = outcome()
    monkeypatch.setattr(json_scan, "DECODE_AT_ONCE_BYTES", 0)
    assert outcome() == at_once


def test_a_small_flat_body_is_decoded_in_the_scan_and_a_large_one_is_not():
    small = SMALL_BODIES[0].decode()
    decoded: dict = {}
    spans = json_scan.top_level(small, None, decoded)
    assert decoded["messages"][0]["content"] == "solve 2x = 4" and list(decoded) == list(spans)
    large = '{"model":"auto","x":"%s"}' % ("a" * json_scan.DECODE_AT_ONCE_BYTES)
    decoded = {}
    assert list(json_scan.top_level(large, None, decoded)) == ["model", "x"] and decoded == {}
