"""The chain's deadline (FilterChain.run): a filter is run at once, and only a wait is timed."""

from __future__ import annotations

import asyncio
import time

from filters.chain import FilterChain


class Ctx:
    """What the chain reads of a request: its deadline and whether a filter replied."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.immediate = None


def chain_of(*filters) -> FilterChain:
    return FilterChain(list(filters))


def test_a_filter_that_never_waits_finishes_even_past_the_deadline():
    seen = []

    async def decides(ctx):
        seen.append("decided")

    why = asyncio.run(chain_of(decides).run(Ctx(time.monotonic() - 1.0)))  # type: ignore[arg-type]
    assert (why, seen) == (None, ["decided"])


def test_what_a_filter_waits_for_comes_back_to_it_value_or_error():
    got = []

    async def waits(ctx):
        loop = asyncio.get_running_loop()
        ok, bad = loop.create_future(), loop.create_future()
        loop.call_later(0.01, ok.set_result, 42)
        loop.call_later(0.02, bad.set_exception, KeyError("gone"))
        got.append(await ok)
        try:
            await bad
        except KeyError as exc:
            got.append(str(exc))
        await asyncio.sleep(0)  # a bare yield to the loop

    why = asyncio.run(chain_of(waits).run(Ctx(time.monotonic() + 5.0)))  # type: ignore[arg-type]
    assert (why, got) == (None, [42, "'gone'"])


def test_a_wait_past_the_deadline_is_cancelled_in_the_filter_and_the_chain_says_timeout():
    cleaned, after = [], []

    async def stalls(ctx):
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append(True)  # its cancellation reached it: nothing keeps running behind the request

    async def later(ctx):
        after.append(True)

    async def main():
        began = time.monotonic()
        why = await chain_of(stalls, later).run(Ctx(time.monotonic() + 0.05))  # type: ignore[arg-type]
        return why, time.monotonic() - began

    why, took = asyncio.run(main())
    assert why == "fallback_timeout" and cleaned == [True] and after == []
    assert took < 1.0

