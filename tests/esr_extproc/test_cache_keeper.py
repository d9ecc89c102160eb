"""Behind the rendered Envoy config the answer keeper hands a cacheable answer back whole, in one
call (esr_extproc/keeper.py); behind any other gateway the router watches it stream past."""

from __future__ import annotations

import json

import numpy as np
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from esr_cache.cache import ResponseCache
from esr_cache.config import CacheConfig
from esr_cache.semantic import Turn
from esr_extproc import keeper
from esr_extproc.headers import CACHE_KEEPER, CACHE_NAMESPACE
from tests.support.extproc import Harness, body_msg, chat, headers_msg, run

ANSWER = json.dumps({"object": "chat.completion", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "x = 3"}, "finish_reason": "stop"}]}).encode()
BEHIND_KEEPER = [(CACHE_KEEPER, "lua")]


def test_an_entry_token_carries_the_key_the_turn_and_the_time():
    turn = Turn("scope", np.arange(4, dtype=np.float32), 12)
    entry = keeper.read_token(keeper.entry_token("k" * 64, 1700000000.5, turn))
    assert entry.key == "k" * 64 and entry.sent_at == 1700000000.5
    assert entry.turn.scope == "scope" and entry.turn.length == 12 and entry.turn.vector.tolist() == [0, 1, 2, 3]
    assert keeper.read_token(keeper.entry_token("k", 1.0, None)).turn is None
    for bad in ("", "a;b;c", "k;not-a-time", "k;1;s;2;%%%"):
        try:
            keeper.read_token(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} read as an entry")


def test_behind_the_keeper_the_answer_is_handed_back_whole_and_elsewhere_watched():
    async def main():
        async with Harness(cache=ResponseCache(CacheConfig(enabled=True))) as h:
            watched, _ = await h.exchange(headers_msg(), body_msg(chat("solve 2x = 4")))
            assert watched.request_headers.response.header_mutation.remove_headers  # strips what clients send
            assert watched.mode_override.response_body_mode == processing_mode_pb2.ProcessingMode.STREAMED

            kept, routed = await h.exchange(headers_msg(extra=BEHIND_KEEPER), body_msg(chat("solve 2x = 6")))
            assert not kept.HasField("mode_override")  # nothing of the answer comes through the stream
            assert CACHE_KEEPER in kept.request_headers.response.header_mutation.remove_headers  # not to the backend
            token = routed.dynamic_metadata.fields[CACHE_NAMESPACE].struct_value.fields["entry"].string_value
            keep = h.channel.unary_unary(keeper.METHOD)
            await keep(ANSWER, metadata=((keeper.ENTRY, token), (keeper.SIZE, str(len(ANSWER)))))

            _, hit = await h.exchange(headers_msg(extra=BEHIND_KEEPER), body_msg(chat("solve 2x = 6")))
            assert hit.immediate_response.status.code == 200
            assert json.loads(hit.immediate_response.body)["choices"][0]["message"]["content"] == "x = 3"

            # A call the router did not name, or an answer past the entry limit, is not kept.
            await keep(ANSWER, metadata=((keeper.ENTRY, "forged"),))
            await keep(b"", metadata=((keeper.ENTRY, token.replace(token[:8], "0" * 8)), (keeper.SIZE, str(2 << 20))))
            assert len(h.cache.memory) == 1

    run(main())
