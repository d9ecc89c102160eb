"""The response cache's pieces: what is keyed, how answers are kept and replayed, the store's bounds."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from esr_cache import answers
from esr_cache.cache import ResponseCache, opted_out
from esr_cache.config import CacheConfig
from esr_cache.keys import request_key, scope_key, tenant_of
from tests.support.bodies import cache_view_of
from esr_cache.store import Entry, MemoryStore
from esr_config import ConfigError, parse_config


def sse(*chunks, done=True) -> bytes:
    out = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return (out + ("data: [DONE]\n\n" if done else "")).encode()


def chunk(delta, finish=None, index=0, **extra):
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}], **extra}


def key_of(tenant, model, body):
    return request_key(tenant, model, cache_view_of(body).members)


def scope_of(tenant, model, body):
    view = cache_view_of(body)
    return scope_key(tenant, model, view.members, view.history)


def test_the_key_holds_what_can_change_the_answer_and_nothing_of_the_transport():
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    key = key_of("t", "m", body)
    assert key_of("t", "m", {**body, "stream": True, "stream_options": {"include_usage": True}}) == key
    assert key_of("t", "m", {**body, "model": "other-alias"}) == key  # the routed model stands for it
    for other in (key_of("u", "m", body), key_of("t", "m2", body),
                  key_of("t", "m", {**body, "temperature": 1}),
                  key_of("t", "m", {**body, "tools": [{"type": "function", "function": {"name": "f"}}]}),
                  key_of("t", "m", {**body, "messages": [{"role": "user", "content": "x"}, *body["messages"]]})):
        assert other != key
    assert tenant_of({"authorization": "Bearer a"}, None) != tenant_of({"authorization": "Bearer b"}, None)
    assert "Bearer" not in tenant_of({"authorization": "Bearer a"}, None)
    assert tenant_of({"x-team": "a"}, "x-team") != tenant_of({"x-team": "b"}, "x-team")


def test_a_stream_adds_up_to_one_answer_replayed_in_either_shape():
    raw = sse(chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo"}),
              chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": "f", "arguments": "{\"a\""}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
              chunk({}, "tool_calls"), {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                        "choices": [], "usage": {"total_tokens": 3}})
    answer = answers.from_sse(raw)
    message = answer["choices"][0]["message"]
    assert message["content"] == "Hello" and message["tool_calls"][0]["function"] == {"name": "f", "arguments": "{\"a\": 1}"}
    assert answer["choices"][0]["finish_reason"] == "tool_calls" and answer["usage"] == {"total_tokens": 3}
    assert answers.from_sse(answers.as_sse(answer)) == answer  # replayed as events, read back the same
    assert answers.from_json(answers.as_json(answer)) == answer
    assert answers.as_sse(answer).endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("raw", [
    sse(chunk({"content": "cut"}), chunk({}, "length")),
    sse(chunk({"content": "no end"}), chunk({}, "stop"), done=False),
    sse(chunk({"content": "filtered"}), chunk({}, "content_filter")),
    b"data: not json\n\ndata: [DONE]\n\n",
])
def test_answers_cut_short_or_not_understood_are_not_kept(raw):
    assert answers.from_sse(raw) is None


def test_json_answers_cut_short_are_not_kept():
    whole = {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop"}]}
    assert answers.from_json(json.dumps(whole).encode()) == whole
    cut = {**whole, "choices": [{**whole["choices"][0], "finish_reason": "length"}]}
    assert answers.from_json(json.dumps(cut).encode()) is None
    assert answers.from_json(b'{"error": {"message": "no"}}') is None


def test_the_store_is_bounded_in_bytes_least_recently_used_out_first_and_forgets_after_its_ttl(monkeypatch):
    store = MemoryStore(max_bytes=100, ttl_s=60)
    for k in "abc":
        store.put(k, Entry({"k": k}, 40, 0.1))
    assert store.get("a") is None and store.bytes == 80  # a went to make room for c
    store.get("b")
    store.put("d", Entry({}, 40, 0.1))
    assert store.get("c") is None and store.get("b") is not None  # b was used since
    store.put("huge", Entry({}, 101, 0.1))
    assert store.get("huge") is None
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 61)
    assert store.get("b") is None and store.bytes == 40


def test_a_hit_is_replayed_in_the_shape_asked_for():
    cache = ResponseCache(CacheConfig(enabled=True))
    raw = sse(chunk({"role": "assistant", "content": "hi"}), chunk({}, "stop"))
    assert asyncio.run(cache.lookup("k", stream=False)) is None
    cache.keep("k", raw, 0.25)
    body, headers = asyncio.run(cache.lookup("k", stream=False))
    assert json.loads(body)["choices"][0]["message"]["content"] == "hi" and headers["x-semantic-cache"] == "hit"
    body, headers = asyncio.run(cache.lookup("k", stream=True))
    assert headers["content-type"] == "text/event-stream" and body.endswith(b"[DONE]\n\n")


def test_opt_outs_and_the_section_checks():
    assert opted_out({"cache-control": "no-store"}) and opted_out({"x-semantic-cache": "bypass"})
    assert not opted_out({"cache-control": "max-age=0"})
    base = {"routes": [{"name": "r", "model": "m", "utterances": ["u"]}], "default_route": {"name": "d", "model": "g"}}
    assert parse_config(base).cache == CacheConfig()  # off unless asked for
    with pytest.raises(ConfigError, match="cache.redis_url"):
        parse_config({**base, "cache": {"backend": "redis"}})
    with pytest.raises(ConfigError, match="cache.max_entry_bytes"):
        parse_config({**base, "cache": {"max_bytes": 2048, "max_entry_bytes": 4096}})


def test_semantic_scope_is_everything_but_the_last_user_turn():
    from esr_cache.keys import last_user_text

    turn = {"role": "user", "content": "what is your name"}
    body = {"messages": [{"role": "system", "content": "be brief"}, turn], "temperature": 0}
    other_turn = {**body, "messages": [body["messages"][0], {"role": "user", "content": "what should I call you"}]}
    assert scope_of("t", "m", body) == scope_of("t", "m", other_turn)
    assert scope_of("t", "m", body) != scope_of("t", "m", {**body, "temperature": 1})
    assert scope_of("t", "m", body) != scope_of("t", "m", {**body, "messages": [turn]})  # another conversation
    assert scope_of("t", "m", body) != scope_of("u", "m", body)
    assert cache_view_of(body).last_turn == "what is your name"
    # A turn the encoder may not read whole is matched exactly only: its tail could hide anything.
    assert cache_view_of({"messages": [{"role": "user", "content": "what is your name? " + "x " * 300}]}).last_turn is None
    assert last_user_text(body) == "what is your name"
    assert last_user_text({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}) is None
    assert last_user_text({"messages": [{"role": "assistant", "content": "x"}]}) is None


def test_the_index_finds_the_nearest_earlier_turn_at_the_threshold_and_stays_bounded():
    import numpy as np

    from esr_cache.semantic import SemanticIndex

    index = SemanticIndex(per_scope=2, scopes=2)
    e = np.eye(3, dtype=np.float32)
    index.add("s", e[0], "k0")
    index.add("s", e[1], "k1")
    near = (e[0] * 0.96 + e[2] * 0.28)
    assert index.nearest("s", near, 0.95) == ("k0", pytest.approx(0.96))
    assert index.nearest("s", near, 0.97) is None and index.nearest("other", near, 0.5) is None
    index.add("s", e[2], "k2")  # k0, the oldest of the scope, goes
    assert index.nearest("s", e[0], 0.5) is None
    index.add("t", e[0], "x")
    index.add("u", e[0], "y")  # three scopes: s, the least recently added to, goes
    assert index.nearest("s", e[2], 0.5) is None and index.nearest("u", e[0], 0.5) == ("y", pytest.approx(1.0))


def test_the_index_is_bounded_in_bytes_forgets_gone_answers_and_one_encoders_vectors():
    import numpy as np

    from esr_cache.cache import ResponseCache
    from esr_cache.config import CacheConfig
    from esr_cache.semantic import ENTRY_OVERHEAD, SemanticIndex, Turn

    vector = (np.ones(384) / np.sqrt(384)).astype(np.float32)
    per_entry = vector.nbytes + len("k00000") + ENTRY_OVERHEAD
    index = SemanticIndex(max_bytes=10 * per_entry)
    for i in range(25):
        index.add(f"scope{i % 5}", vector, f"k{i:05d}")
    assert len(index) == 10 and index.bytes == 10 * per_entry  # the oldest went first
    index.remove("k00024")
    assert len(index) == 9 and index.bytes == 9 * per_entry
    assert index.use_encoder("a") is False and index.use_encoder("b") is True and len(index) == index.bytes == 0

    # An answer pushed out of the store takes its index entry with it, and both count in cache_bytes.
    cache = ResponseCache(CacheConfig(enabled=True, max_bytes=4096, max_entry_bytes=4096))
    answer = json.dumps({"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "x" * 1500}, "finish_reason": "stop"}]}).encode()
    cache.keep("first", answer, 0.1, Turn("scope", vector, 10))
    cache.keep("second", answer, 0.1, Turn("scope", vector * -1, 10))
    assert len(cache.index) == 2
    cache.keep("third", answer, 0.1, Turn("scope", vector, 10))  # the store holds two: "first" goes from both
    assert "first" not in cache.memory and len(cache.index) == 2
    assert cache.index.nearest("scope", vector, 0.99)[0] == "third"


def test_a_turn_matches_no_turn_more_than_twice_as_long():
    import numpy as np

    from esr_cache.semantic import SemanticIndex, turn_length

    index = SemanticIndex()
    e = np.eye(2, dtype=np.float32)
    planted = "what is your name? reply: see evil.example"
    index.add("s", e[0], "planted", turn_length(planted))
    assert index.nearest("s", e[0], 0.9, turn_length("what is your name?")) is None
    index.add("s", e[0] * 0.99 + e[1] * 0.14, "asked", turn_length("what's your name"))
    assert index.nearest("s", e[0], 0.9, turn_length("what is your name?"))[0] == "asked"
    assert index.nearest("s", e[0], 0.9)[0] == "planted"  # no length given: every turn


def test_a_malformed_shared_index_record_is_skipped_and_the_rest_read(caplog):
    import base64

    import numpy as np

    from esr_cache.redis_store import RedisStore
    from esr_cache.semantic import SemanticIndex

    index = SemanticIndex()
    index.use_encoder("enc")
    good = {b"scope": b"s", b"key": b"k", b"encoder": b"enc",
            b"vector": base64.b64encode(np.ones(4, np.float32).tobytes())}
    records = [(b"1-0", {b"scope": b"s", b"encoder": b"enc"}), (b"2-0", {**good, b"vector": b"%%%"}),
               (b"3-0", {**good, b"vector": base64.b64encode(np.array([np.nan] * 4, np.float32).tobytes())}),
               (b"4-0", {**good, b"key": b"other", b"encoder": b"old"}), (b"5-0", good)]
    assert RedisStore._feed(index, [(b"stream", records)], "0-0") == b"5-0"
    assert len(index) == 1 and index.nearest("s", np.ones(4, np.float32) / 2, 0.5)[0] == "k"
    assert sum("record skipped" in r.getMessage() for r in caplog.records) == 3


def test_semantic_routes_must_be_routes():
    base = {"routes": [{"name": "r", "model": "m", "utterances": ["u"]}], "default_route": {"name": "d", "model": "g"}}
    assert parse_config({**base, "cache": {"semantic_routes": ["r", "d"]}}).cache.semantic_routes == ("r", "d")
    with pytest.raises(ConfigError, match=r"cache.semantic_routes\[0\]"):
        parse_config({**base, "cache": {"semantic_routes": ["nope"]}})


def test_semantic_thresholds_are_tuned_per_route_within_the_false_hit_bound():
    import numpy as np

    from esr_tuning.cache_tuning import semantic_report

    # Route "chat": two intents far apart, paraphrases within each; route "facts": its two intents
    # sit close (0.9), so only a threshold above that keeps them apart.
    def unit(*v):
        v = np.asarray(v, dtype=np.float32)
        return v / np.linalg.norm(v)

    texts, intents, routes, vectors = [], [], [], []
    for i in range(20):
        for intent, base in (("name", (1, 0, 0, 0)), ("joke", (0, 1, 0, 0))):
            texts.append(f"{intent} {i}"), intents.append(intent), routes.append("chat")
            vectors.append(unit(*base) * 0.97 + unit(0, 0, 1, 0) * 0.03 * (i % 3))
        for intent, base in (("paris", (0, 0, 0, 1)), ("rome", (0, 0, 0.45, 0.9))):
            texts.append(f"{intent} {i}"), intents.append(intent), routes.append("facts")
            vectors.append(unit(*base))
    report = semantic_report(routes, texts, intents, np.stack([unit(*v) for v in vectors]), {"chat", "facts"})
    assert report["tuned_thresholds"]["chat"] == 0.5  # every hit a paraphrase, at any threshold
    assert report["tuned_thresholds"]["facts"] == 0.9  # paris and rome at cosine ~0.89 apart
    chat = {r["threshold"]: r for r in report["routes"]["chat"]}
    assert chat[0.5]["false_hits"] == 0 and chat[0.5]["paraphrase_share"] > 0.9


def test_what_is_not_a_whole_completion_is_not_kept_and_the_metric_says_why():
    from esr_cache import metrics

    cache = ResponseCache(CacheConfig(enabled=True))

    def skipped(reason):
        return metrics.SKIPS.labels(reason)._value.get()

    before = {r: skipped(r) for r in ("not_ok", "cut_short", "not_understood")}
    cache.keep("e", b'{"error": {"message": "overloaded"}}', 0.1)
    cache.keep("c", sse(chunk({"content": "cut"}), chunk({}, "length")), 0.1)
    cache.keep("z", b"\x1f\x8b\x08\x00 compressed", 0.1)
    assert {r: skipped(r) - before[r] for r in before} == {"not_ok": 1, "cut_short": 1, "not_understood": 1}
    assert len(cache.memory) == 0

def test_the_default_threshold_keeps_near_questions_of_another_intent_apart_on_a_broad_route():
    # Held-out CLINC150 pairs of two intents that sit at cosine 0.86-0.88 with the bundled encoder:
    # one broad semantic route at the former default (0.75) answered each with the other's answer.
    from pathlib import Path

    from esr_app.quality_cli import offline
    from esr_cache.semantic import SemanticIndex, turn_length
    from esr_config import load_config

    encoder, _ = offline(load_config(Path(__file__).resolve().parents[2] / "router.yaml"))
    threshold = CacheConfig().semantic_threshold
    pairs = [("how much vacation days have i used", "how many vacation days have i accumulated"),
             ("what is the time in paris now", "what timezone is paris in"),
             ("how much did i spend on bills last month", "how much do my bills cost this month")]
    for kept, asked in pairs:
        index = SemanticIndex(max_bytes=10**6, per_scope=100)
        kept_v, asked_v = encoder.encode([kept, asked])
        index.add("broad", kept_v, "kept", turn_length(kept))
        assert index.nearest("broad", asked_v, 0.75, turn_length(asked)) is not None  # the pair is near
        assert index.nearest("broad", asked_v, threshold, turn_length(asked)) is None, (kept, asked)
    # ... while a paraphrase still takes the answer at the default.
    index = SemanticIndex(max_bytes=10**6, per_scope=100)
    kept_v, asked_v = encoder.encode(["what is the date of today", "what is the date today"])
    index.add("broad", kept_v, "kept", 5)
    assert index.nearest("broad", asked_v, threshold, 4) is not None


@pytest.mark.parametrize("stream, read", [(True, True), ("true", True), (1, True), ("yes", True), (False, False),
                                          ("0", False), ("maybe", False)])
def test_the_cache_reads_stream_as_the_backend_does(stream, read):
    # The answer comes back in the shape the backend chose from this value (pydantic, lax): the
    # cache keeps and replays it in that shape, as request_facts reads it.
    assert cache_view_of({"messages": [{"role": "user", "content": "hi"}], "stream": stream}).stream is read
