"""Conversation routing: which turn decides (hand-placed vectors), the embedding cache, and the
whole path through the ext_proc service on a fake model."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from router.classifier import RouteClassifier
from esr_config import ConfigError, parse_config
from router.conversation import deciding_turn
from router.embedding_cache import EmbeddingCache
from tests.support.fakes import FakeBackend, config, encode, unit
from tests.support.waiting import until
from tests.support.extproc import CONFIG, Harness, body_msg, headers_msg, run, set_headers

MATH, CODE, VAGUE, OFF = unit(1, 0.1, 0), unit(0.1, 1, 0), unit(0.6, 0.6, 0.55), unit(0.2, 0.2, 1)


def decide(clf, gate, *turns):
    turn, choice = deciding_turn(clf, clf.scores(np.stack(turns)), gate)
    return turn, (clf.routes[choice].name if choice >= 0 else "general")


def test_a_follow_up_that_names_no_route_keeps_the_earlier_route():
    clf = RouteClassifier(config(), encode)
    assert decide(clf, None, MATH, OFF) == (0, "math")  # OFF clears no threshold: not decisive
    assert decide(clf, None, MATH, OFF, OFF) == (0, "math")


def test_a_clear_new_topic_switches():
    clf = RouteClassifier(config(), encode)
    assert decide(clf, None, MATH, OFF, CODE) == (2, "code")
    assert decide(clf, None, CODE, MATH, OFF) == (1, "math")  # the most recent decisive turn, not the first


def test_the_gate_makes_a_weak_win_indecisive():
    clf = RouteClassifier(config(default_threshold=0.5), encode)
    weak = clf.scores(VAGUE[None])[0]
    assert 0.5 < weak.max() < 0.9  # VAGUE wins a route, weakly
    assert decide(clf, None, CODE, VAGUE)[0] == 1  # without a gate, winning is decisive
    assert decide(clf, 0.9, CODE, VAGUE) == (0, "code")  # with one, it keeps the earlier route


def test_with_no_decisive_turn_the_most_confident_one_decides():
    clf = RouteClassifier(config(default_threshold=0.5), encode)
    assert decide(clf, 0.99, OFF, VAGUE, OFF)[0] == 1
    assert decide(clf, None, OFF)[1] == "general"


def test_a_turn_that_the_default_routes_examples_win_is_decisive():
    cfg = config(default_route={"name": "general", "model": "general-model", "utterances": ["g1"]})
    clf = RouteClassifier(cfg, encode)
    assert decide(clf, None, MATH, unit(0, 0, 1)) == (1, "general")  # the user left the topic: general wins
    assert decide(clf, None, MATH, unit(0.5, 0.5, 0.5))[0] == 0  # nothing cleared and general not ahead


def test_policy_keys_are_validated():
    base = {"routes": [{"name": "a", "model": "m", "utterances": ["x"]}], "default_route": {"name": "d", "model": "n"}}
    with pytest.raises(ConfigError, match="requests.prompt_turns"):
        parse_config({**base, "requests": {"prompt_turns": 3}})
    with pytest.raises(ConfigError, match="requests.include_system"):
        parse_config({**base, "requests": {"include_system": True}})
    parse_config({**base, "requests": {"prompt_turns": 3}, "conversation": {"policy": "last_turns"}})
    with pytest.raises(ConfigError, match="conversation.max_turns"):
        parse_config({**base, "conversation": {"max_turns": 0}})
    with pytest.raises(ConfigError, match=r"requests.harness_tags\[1\]"):
        parse_config({**base, "requests": {"harness_tags": ["ok", "<bad>"]}})


# The embedding cache.

def vec(text: str) -> np.ndarray:
    return np.full(4, float(len(text)), dtype=np.float32)


class Counting:
    def __init__(self, fail: bool = False):
        self.calls: list[str] = []
        self.release = asyncio.Event()
        self.fail = fail

    def __call__(self, text: str, wait: bool = False):
        async def compute():
            self.calls.append(text)
            if wait:
                await self.release.wait()
            if self.fail:
                raise RuntimeError("model failed")
            return vec(text)
        return compute


def waiters(cache: EmbeddingCache, model: Counting, text: str, n: int = 2) -> list[asyncio.Future]:
    """`n` requests asking the cache for `text` at once; the model holds until released."""
    return [asyncio.ensure_future(cache.get(text, model(text, wait=True))) for _ in range(n)]


def test_each_distinct_text_is_computed_once_and_the_oldest_leaves_first():
    async def main():
        cache, model = EmbeddingCache(2), Counting()
        for text in ("a", "bb", "a", "ccc", "a", "bb"):
            got = await cache.get(text, model(text))
            assert np.array_equal(got, vec(text))
        assert model.calls == ["a", "bb", "ccc", "bb"]  # "bb" left when "ccc" came ("a" was used since)
        assert len(cache) == 2
        with pytest.raises(ValueError):
            got[0] = 1.0  # shared by every request: read-only

    run(main())


def test_a_text_in_flight_is_shared_and_a_failure_is_not_kept():
    async def main():
        cache, model = EmbeddingCache(8), Counting()
        first, second = waiters(cache, model, "same")
        await asyncio.sleep(0)
        model.release.set()
        assert np.array_equal(await first, await second)
        assert model.calls == ["same"]

        broken = Counting(fail=True)
        for _ in range(2):
            with pytest.raises(RuntimeError):
                await cache.get("x", broken("x"))
        assert broken.calls == ["x", "x"]  # asked again: a failure is not an answer

    run(main())


def test_a_waiter_with_time_left_is_not_failed_by_the_first_requesters_deadline():
    from batching import DeadlineExceeded

    async def main():
        cache = EmbeddingCache(8)

        async def soon_late():  # the first requester: its deadline passes while computing
            await asyncio.sleep(0.01)
            raise DeadlineExceeded("first requester's deadline")

        async def in_time():
            return vec("same")

        first = asyncio.create_task(cache.get("same", soon_late))
        second = asyncio.create_task(cache.get("same", in_time))
        with pytest.raises(DeadlineExceeded):
            await first
        assert np.array_equal(await second, vec("same"))  # it tried again on its own deadline

    run(main())


def test_one_waiter_leaving_keeps_the_computation_the_last_one_cancels_it():
    async def main():
        cache, model = EmbeddingCache(8), Counting()
        first, second = waiters(cache, model, "t")
        await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.sleep(0.01)
        model.release.set()
        assert np.array_equal(await second, vec("t"))

        model.release.clear()
        lone = asyncio.ensure_future(cache.get("u", model("u", wait=True)))
        await until(lambda: cache._flights, 5, "the computation in flight")
        flight = next(iter(cache._flights.values())).task
        lone.cancel()
        # Nobody wants it: the batcher may drop it before it is computed.
        await until(flight.cancelled, 5, "the last waiter leaving cancels the computation")
        assert len(cache) == 1

    run(main())


# Through the service, on a fake model.

def convo(*turns: str) -> dict:
    messages = []
    for i, text in enumerate(turns):
        if i:
            messages.append({"role": "assistant", "content": f"answer {i}"})
        messages.append({"role": "user", "content": text})
    return {"model": "auto", "messages": messages}


async def route(h: Harness, body: dict) -> tuple[str, str]:
    _, resp = await h.exchange(headers_msg(), body_msg(body))
    hs = set_headers(resp)
    return hs["x-semantic-route"], hs["x-semantic-route-reason"]


def test_conversation_through_the_service_embeds_each_turn_once():
    backend = FakeBackend()

    async def main():
        async with Harness(CONFIG, backend) as h:
            assert await route(h, convo("solve 3x + 5 = 20")) == ("math", "matched")
            assert await route(h, convo("solve 3x + 5 = 20", "and why is that?")) == ("math", "context")
            assert await route(h, convo("solve 3x + 5 = 20", "and why is that?", "thanks!")) == ("math", "context")
            switched = convo("solve 3x + 5 = 20", "and why is that?", "thanks!", "write a python function")
            assert await route(h, switched) == ("code", "matched")
            last_turns = await route(h, convo("solve 3x + 5 = 20", "something new"))
        assert last_turns == ("math", "context")
        texts = [t for batch in backend.batches for t in batch]
        # Every distinct user turn once, whatever the number of requests that carried it.
        assert sorted(texts) == sorted({"solve 3x + 5 = 20", "write a python function", "and why is that?",
                                        "thanks!", "something new"})

    run(main())


def test_last_turns_policy_routes_on_the_last_turn_alone():
    cfg = {**CONFIG, "conversation": {"policy": "last_turns"}}

    async def main():
        async with Harness(cfg) as h:
            assert await route(h, convo("solve 3x + 5 = 20", "and why is that?")) == ("general", "default")

    run(main())


def test_resizing_keeps_the_most_recent():
    async def main():
        cache, model = EmbeddingCache(4), Counting()
        for text in ("a", "bb", "ccc", "dddd"):
            await cache.get(text, model(text))
        cache.resize(2)
        assert len(cache) == 2
        await cache.get("dddd", model("dddd"))
        assert model.calls == ["a", "bb", "ccc", "dddd"]  # still held

    run(main())
