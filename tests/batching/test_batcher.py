"""The continuous batcher with a fake model: batch formation, limits, fairness and every failure path."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from batching import (BatcherClosed, BatcherSettings, ContinuousBatcher, DeadlineExceeded, Overloaded, RemoteError,
                      WouldMissDeadline)
from batching.queue import WorkItem, choose_batch
from tests.support.fakes import POISON, FakeBackend, vector_for
from tests.support.waiting import until


class CountingObserver:
    def __init__(self):
        self.batches = []
        self.dropped = {}
        self.tokenized = {}

    def on_batch(self, size, tokens, padded_tokens, inference_s, queue_waits_s):
        self.batches.append((size, tokens, padded_tokens))

    def on_dropped(self, reason, count):
        self.dropped[reason] = self.dropped.get(reason, 0) + count

    def on_queue_depth(self, requests, tokens):
        pass

    def on_tokenized(self, by, count):
        self.tokenized[by] = self.tokenized.get(by, 0) + count


def far() -> float:
    return time.monotonic() + 30


async def wait_until(cond, timeout=10.0):
    await until(cond, timeout, "the batcher's state", 0.005)


async def start_batcher(backend, **settings) -> tuple[ContinuousBatcher, CountingObserver]:
    obs = CountingObserver()
    b = ContinuousBatcher(backend, BatcherSettings(**settings), obs)
    b.start()
    return b, obs


async def queue_behind(b: ContinuousBatcher, backend: FakeBackend, texts: list[str]) -> list[asyncio.Task]:
    """Submit `texts` in order while the model is held, and wait until all are tokenized and queued."""
    already = len(backend.tokenized)
    tasks = [asyncio.create_task(b.embed(t, far())) for t in texts]
    await wait_until(lambda: len(backend.tokenized) == already + len(texts))
    return tasks


async def hold_first(b: ContinuousBatcher, backend: FakeBackend) -> asyncio.Task:
    """Occupy the model thread with one request so that later ones queue up."""
    first = asyncio.create_task(b.embed("first", far()))
    await asyncio.to_thread(backend.entered.wait, 10)
    return first


def test_results_match_each_request():
    async def main():
        b, _ = await start_batcher(FakeBackend())
        texts = [f"text number {i}" for i in range(20)]
        out = await asyncio.gather(*(b.embed(t, far()) for t in texts))
        for t, v in zip(texts, out):
            np.testing.assert_allclose(v, vector_for(t))
        await b.aclose()

    asyncio.run(main())


def test_requests_arriving_while_model_busy_form_one_batch():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend)
        first = await hold_first(b, backend)
        rest = await queue_behind(b, backend, [f"q {i}" for i in range(10)])
        backend.gate.set()
        await asyncio.gather(first, *rest)
        assert [len(x) for x in backend.batches] == [1, 10]
        assert [s for s, _, _ in obs.batches] == [1, 10]
        await b.aclose()

    asyncio.run(main())


def test_max_batch_size_splits_queue_fifo():
    async def main():
        backend = FakeBackend(hold=True)
        b, _ = await start_batcher(backend, max_batch_size=4)
        first = await hold_first(b, backend)
        rest = await queue_behind(b, backend, [f"same length {i}" for i in range(10)])
        backend.gate.set()
        await asyncio.gather(first, *rest)
        assert [len(x) for x in backend.batches] == [1, 4, 4, 2]
        # Equal lengths: batches keep arrival order.
        assert backend.batches[1] == [f"same length {i}" for i in range(4)]
        await b.aclose()

    asyncio.run(main())


def test_padded_token_budget_is_respected():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend, max_batch_size=64, max_batch_tokens=40)
        first = await hold_first(b, backend)
        texts = [" ".join(["w"] * n) for n in (2, 18, 3, 17, 2, 4, 16, 1)]
        rest = await queue_behind(b, backend, texts)
        backend.gate.set()
        await asyncio.gather(first, *rest)
        assert all(padded <= 40 for _, _, padded in obs.batches)
        assert sorted(t for batch in backend.batches[1:] for t in batch) == sorted(texts)
        await b.aclose()

    asyncio.run(main())


def _items(lengths):
    return [WorkItem(text=str(i), deadline=0, future=None, enqueued_at=0.0, inputs=[0] * n) for i, n in enumerate(lengths)]


def test_choose_batch_always_takes_the_oldest_and_groups_by_length():
    window = _items([50, 5, 6, 48, 7, 49, 5])
    picked = choose_batch(window, max_size=3, max_tokens=10_000)
    assert 0 in picked
    assert sorted(window[i].n_tokens for i in picked) == [48, 49, 50]


def test_choose_batch_cuts_padding_against_fifo():
    window = _items([5, 50, 6, 48, 7, 5])
    picked = choose_batch(window, max_size=4, max_tokens=10_000)
    assert sorted(window[i].n_tokens for i in picked) == [5, 5, 6, 7]


def test_choose_batch_takes_a_window_that_fits_whole_as_its_growth_would():
    # Without a padding bound, a window within the size and token caps is taken whole at once;
    # the growth from the oldest (a padding bound just under 1 goes that way) takes the same items.
    rng = random.Random(7)
    for _ in range(300):
        window = _items([rng.randint(1, 300) for _ in range(rng.randint(1, 80))])
        size, tokens = rng.choice([8, 64, 128]), rng.choice([512, 8192, 32_768])
        whole = choose_batch(window, size, tokens, max_padding=1.0)
        grown = choose_batch(window, size, tokens, max_padding=1.0 - 1e-12)
        assert sorted(whole) == sorted(grown) and 0 in whole


def test_long_request_does_not_starve_behind_short_ones():
    async def main():
        backend = FakeBackend(hold=True)
        b, _ = await start_batcher(backend, max_batch_size=2, sort_window=4)
        first = await hold_first(b, backend)
        long_text = " ".join(["long"] * 30)
        tasks = await queue_behind(b, backend, [long_text] + [f"s {i}" for i in range(12)])
        backend.gate.set()
        await asyncio.gather(first, *tasks)
        # The long request was the oldest queued one, so it went in the very next batch.
        assert long_text in backend.batches[1]
        await b.aclose()

    asyncio.run(main())


def test_full_queue_fails_at_once_with_overload():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend, max_batch_size=1, max_queue_requests=2)
        first = await hold_first(b, backend)
        queued = [asyncio.create_task(b.embed(f"q{i}", far())) for i in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(Overloaded):  # refused while the model is held: it did not wait for it
            await b.embed("one too many", far())
        assert not first.done()
        assert obs.dropped["overload"] == 1
        backend.gate.set()
        await asyncio.gather(first, *queued)
        await b.aclose()

    asyncio.run(main())


def test_token_bound_on_queue_overloads():
    async def main():
        backend = FakeBackend(hold=True)
        b, _ = await start_batcher(backend, max_batch_size=1, max_queue_tokens=10)
        first = await hold_first(b, backend)
        with pytest.raises(Overloaded):
            await b.embed(" ".join(["x"] * 20), far())
        backend.gate.set()
        await first
        await b.aclose()

    asyncio.run(main())


def test_expired_request_is_never_computed():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend)
        first = await hold_first(b, backend)
        with pytest.raises(DeadlineExceeded):
            await b.embed("too late", time.monotonic() + 0.05)
        backend.gate.set()
        await first
        await b.embed("after", far())
        assert all("too late" not in batch for batch in backend.batches)
        assert obs.dropped.get("cancelled", 0) + obs.dropped.get("expired", 0) >= 1
        await b.aclose()

    asyncio.run(main())


def test_cancelled_request_is_never_computed():
    async def main():
        backend = FakeBackend(hold=True)
        b, _ = await start_batcher(backend)
        first = await hold_first(b, backend)
        gone = asyncio.create_task(b.embed("client went away", far()))
        await wait_until(lambda: "client went away" in backend.tokenized)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone  # the caller has stopped waiting: only now is the item marked
        backend.gate.set()
        await first
        await b.embed("after", far())
        assert all("client went away" not in batch for batch in backend.batches)
        await b.aclose()

    asyncio.run(main())


def test_poison_input_fails_only_itself():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend)
        first = await hold_first(b, backend)
        *good, bad = await queue_behind(b, backend, [f"good {i}" for i in range(5)] + [POISON])
        backend.gate.set()
        await asyncio.gather(first, *good)
        with pytest.raises(ValueError):
            await bad
        assert obs.dropped["error"] == 1
        # The batcher keeps serving afterwards.
        np.testing.assert_allclose(await b.embed("later", far()), vector_for("later"))
        await b.aclose()

    asyncio.run(main())


def test_a_batch_failing_for_a_reason_that_is_not_its_inputs_is_not_retried_one_by_one():
    class Down(FakeBackend):  # a remote engine that is down: retrying each input would be a storm
        def embed(self, token_ids, deadline=None):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls > 1:
                raise RemoteError("engine down")
            return super().embed(token_ids, deadline)

    async def main():
        backend = Down(hold=True)
        b, obs = await start_batcher(backend)
        first = await hold_first(b, backend)
        queued = await queue_behind(b, backend, [f"q{i}" for i in range(6)])
        backend.gate.set()
        await first
        for outcome in await asyncio.gather(*queued, return_exceptions=True):
            assert isinstance(outcome, RemoteError)
        assert backend.calls == 2 and obs.dropped["error"] == 6
        await b.aclose()

    asyncio.run(main())


def test_lanes_run_batches_side_by_side_and_each_drains_on_close():
    class Inside(FakeBackend):
        inside = most = 0

        def embed(self, token_ids, deadline=None):
            with self._lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
            try:
                return super().embed(token_ids, deadline)
            finally:
                with self._lock:
                    self.inside -= 1

    async def main():
        backend = Inside(hold=True)
        obs = CountingObserver()
        b = ContinuousBatcher(backend, BatcherSettings(max_batch_size=2), obs, lanes=3)
        b.start()
        await b.started()
        tasks = [asyncio.create_task(b.embed(f"t{i}", far())) for i in range(8)]
        await wait_until(lambda: backend.inside == 3)  # three batches in the model at once
        closing = asyncio.create_task(b.aclose())
        backend.gate.set()
        for i, v in enumerate(await asyncio.gather(*tasks)):
            np.testing.assert_allclose(v, vector_for(f"t{i}"))
        await closing
        assert backend.most == 3 and sum(size for size, _, _ in obs.batches) == 8
        assert not any(t.is_alive() for t in b._threads)

    asyncio.run(main())


def test_shutdown_drains_queued_requests_and_refuses_new_ones():
    async def main():
        backend = FakeBackend(hold=True)
        b, _ = await start_batcher(backend, max_batch_size=2)
        first = await hold_first(b, backend)
        queued = await queue_behind(b, backend, [f"q{i}" for i in range(5)])
        closing = asyncio.create_task(b.aclose())
        await asyncio.sleep(0.05)
        with pytest.raises(BatcherClosed):
            await b.embed("new", far())
        backend.gate.set()
        await closing
        results = await asyncio.gather(first, *queued)
        assert len(results) == 6 and all(r.shape == (FakeBackend.dim,) for r in results)

    asyncio.run(main())


def test_optional_max_wait_tops_up_a_small_batch():
    async def main():
        backend = FakeBackend()
        b, _ = await start_batcher(backend, max_batch_size=2, max_wait_ms=5000.0)
        first = asyncio.create_task(b.embed("alone at first", far()))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(b.embed("arrives later", far()))
        await asyncio.gather(first, second)
        assert backend.batches == [["alone at first", "arrives later"]]
        await b.aclose()

    asyncio.run(main())


def test_warm_up_runs_on_the_model_thread_before_any_batch():
    # Per-thread runtime state (torch's thread pool) must be built where batches run.
    async def main():
        backend = FakeBackend()
        seen = []
        backend.prepare_thread = lambda: seen.append(("prepare", threading.current_thread().name))
        backend.warmup = lambda: seen.append(("warmup", threading.current_thread().name))
        b, _ = await start_batcher(backend)
        await b.started()
        await b.embed("hello", far())
        assert seen == [("prepare", "batcher-model"), ("warmup", "batcher-model")]
        await b.aclose()

    asyncio.run(main())


def test_failed_warm_up_is_raised_by_started():
    async def main():
        backend = FakeBackend()

        def broken():
            raise RuntimeError("no such device")

        backend.warmup = broken
        b, _ = await start_batcher(backend)
        with pytest.raises(RuntimeError, match="no such device"):
            await b.started()
        with pytest.raises(BatcherClosed):
            await b.embed("hello", far())
        await asyncio.wait_for(b.aclose(), 10)

    asyncio.run(main())


def teach(b: ContinuousBatcher, seconds_per_batch: float) -> None:
    """Give the batcher's cost model a history: every batch costs `seconds_per_batch`."""
    for tokens in (4, 8, 16, 32):
        b.cost.observe(tokens, seconds_per_batch)


def test_refused_at_admission_when_the_predicted_answer_is_late_and_never_reaches_the_model():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend)
        teach(b, 0.5)
        first = await hold_first(b, backend)  # a batch predicted to take 0.5 s is running
        with pytest.raises(WouldMissDeadline):
            await b.embed("hopeless", time.monotonic() + 0.3)
        assert "hopeless" not in backend.tokenized  # refused before any work, not at the deadline
        assert obs.dropped["overload"] == 1
        admitted = asyncio.create_task(b.embed("has time", far()))
        backend.gate.set()
        await asyncio.gather(first, admitted)
        assert all("hopeless" not in batch for batch in backend.batches)
        await b.aclose()

    asyncio.run(main())


def test_item_predicted_to_finish_late_is_never_computed():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend)
        teach(b, 0.4)
        first = await hold_first(b, backend)
        # Admitted (0.4 s running + 0.4 s for its own batch < 1.5 s), but the model stays busy.
        late = asyncio.create_task(b.embed("late one", time.monotonic() + 1.5))
        await wait_until(lambda: "late one" in backend.tokenized)
        await asyncio.sleep(1.2)  # now even a batch of its own would end after its deadline
        backend.gate.set()
        with pytest.raises(WouldMissDeadline):
            await late
        await first
        assert all("late one" not in batch for batch in backend.batches)
        assert obs.dropped["late"] == 1
        await b.aclose()

    asyncio.run(main())


def test_batch_is_cut_so_that_its_oldest_item_meets_its_deadline():
    async def main():
        backend = FakeBackend(hold=True)
        b, _ = await start_batcher(backend)
        for tokens in (4, 8, 16, 32):
            b.cost.observe(tokens, 0.1 * tokens)  # 0.1 s per padded token, no fixed part
        first = await hold_first(b, backend)
        # The oldest has ~3 s left: at 4 tokens a prompt, at most 7 fit; the rest have all the time.
        oldest = asyncio.create_task(b.embed("o o", time.monotonic() + 3.0))
        await wait_until(lambda: "o o" in backend.tokenized)
        rest = await queue_behind(b, backend, [f"r {i}" for i in range(12)])
        backend.gate.set()
        await asyncio.gather(first, oldest, *rest)
        second = backend.batches[1]
        assert second[0] == "o o" and 1 <= len(second) <= 7
        assert sorted(t for batch in backend.batches[1:] for t in batch) == sorted(["o o"] + [f"r {i}" for i in range(12)])
        await b.aclose()

    asyncio.run(main())


def test_queue_stamps_items_with_its_own_clock():
    """The injected clock times a small batch's top-up wait; items used to be stamped with
    time.monotonic, so with any other clock the wait ended at the wrong time (or never)."""
    from batching.queue import BatchQueue

    now = [1000.0]
    q = BatchQueue(8, 1024, 8, clock=lambda: now[0])
    item = q.new_item("a", deadline=now[0] + 86400, future=None)
    assert item.enqueued_at == 1000.0
    item.inputs = [1, 2]
    assert q.reserve()
    q.put_many([item])
    now[0] += 7200  # two hours later on the queue's clock: a top-up of up to an hour is long over
    cut = ThreadPoolExecutor(1).submit(q.next_batch, max_size=8, max_tokens=1024, max_wait=3600)
    # A queue that read the wall clock instead would wait out its top-up; with the clock it is
    # given, the batch is cut at once (this wait is only a hang guard).
    assert cut.result(timeout=60).items == [item]


def test_failed_batch_of_one_is_not_reported_as_retried(caplog):
    async def main():
        b, obs = await start_batcher(FakeBackend())
        with pytest.raises(ValueError):
            await b.embed(POISON, far())
        await b.aclose()
        return obs

    with caplog.at_level("WARNING", logger="batching.batcher"):
        obs = asyncio.run(main())
    assert obs.dropped["error"] == 1
    messages = [r.getMessage() for r in caplog.records]
    assert any("embedding failed" in m for m in messages), messages
    assert not any("retrying singly" in m for m in messages), messages


class CalibratedBackend(FakeBackend):
    def warmup(self):
        # Warm singles of 16 and 256 tokens: 6.6 ms fixed, 0.18 ms a token (the bundled model here).
        return [(16, 0.0066 + 16 * 0.00018), (256, 0.0066 + 256 * 0.00018)]


@pytest.mark.parametrize("backend_type, computed", [(FakeBackend, False), (CalibratedBackend, True)])
def test_a_long_prompt_after_short_ones_is_judged_by_the_warm_up_calibration(backend_type, computed):
    # Uncalibrated, 12-token singles at 0.15 s make a 256-token prompt cost 3.2 s (all per-token):
    # refused as late with 2 s left. Calibrated, half the warm-up's fixed part counts: 1.4 s, computed.
    async def main():
        backend = backend_type()
        b, obs = await start_batcher(backend)
        await b.started()
        for _ in range(5):
            b.cost.observe(12, 0.15)
        long = " ".join(f"w{i}" for i in range(254))  # 256 tokens with the fake's two markers
        try:
            await b.embed(long, time.monotonic() + 2.0)
            outcome = True
        except WouldMissDeadline:
            outcome = False
        assert outcome is computed, obs.dropped
        await b.aclose()

    asyncio.run(main())


def test_a_text_over_max_text_chars_is_refused_before_the_tokenizer():
    from batching import TextTooLong

    class Counting(FakeBackend):
        tokenized = 0

        def tokenize(self, texts):
            Counting.tokenized += sum(len(t) for t in texts)
            return super().tokenize(texts)

    async def main():
        batcher = ContinuousBatcher(Counting(), BatcherSettings(max_text_chars=1000))
        batcher.start()
        try:
            with pytest.raises(TextTooLong):
                await batcher.embed("x" * 1001, time.monotonic() + 5)
            assert Counting.tokenized == 0
            await batcher.embed("x" * 1000, time.monotonic() + 5)
            assert Counting.tokenized == 1000
        finally:
            await batcher.aclose()

    asyncio.run(main())


def test_token_ids_a_caller_made_skip_the_tokenizer_and_a_model_that_cannot_read_them_fails_them_alone():
    import array

    from tests.support.fakes import IdsBackend

    async def main():
        for backend in (IdsBackend(), FakeBackend()):
            observer = CountingObserver()
            batcher = ContinuousBatcher(backend, observer=observer)
            batcher.start()
            loop = asyncio.get_running_loop()
            futures = [loop.create_future() for _ in range(3)]
            made = array.array("I", backend.ids_for("made by the caller")).tobytes()
            bad = array.array("I", [101, 1 << 21, 102]).tobytes()  # outside IdsBackend's vocabulary
            batcher.submit_many([(made, far(), futures[0]), ("a text", far(), futures[1]), (bad, far(), futures[2])])
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            np.testing.assert_array_equal(outcomes[1], vector_for("a text"))
            assert backend.tokenized == ["a text"]  # ids are read, never tokenized again
            if isinstance(backend, IdsBackend):
                np.testing.assert_array_equal(outcomes[0], vector_for("made by the caller"))
                assert isinstance(outcomes[2], ValueError) and "vocabulary" in str(outcomes[2])
            else:  # a model that takes text only: ids fail their own request, with a reason
                assert [str(o) for o in (outcomes[0], outcomes[2])] == ["this model takes text, not token ids"] * 2
            assert observer.tokenized == {"caller": 2, "batcher": 1}
            assert batcher.depth == (0, 0)
            await batcher.aclose()

    asyncio.run(main())


@pytest.mark.slow
def test_a_model_that_was_slow_is_tried_again_when_idle_and_relearned():
    """A cost model that learned slow batches once refused every request for good: nothing ran
    to show the model fast again. A batcher idle for longer than it predicts runs the request."""
    async def main():
        backend = FakeBackend()
        b, obs = await start_batcher(backend)
        teach(b, 1.0)  # every batch took 1 s a while ago; the model is fast now
        with pytest.raises(WouldMissDeadline):  # nothing has run for less than a predicted batch
            await b.embed("refused", time.monotonic() + 0.5)
        answered, give_up = 0, time.monotonic() + 30
        while answered < 10 and time.monotonic() < give_up:  # clients keep asking, 20 a second
            try:
                await b.embed(f"ask {answered}", time.monotonic() + 0.5)
                answered += 1
            except WouldMissDeadline:
                answered = 0
                await asyncio.sleep(0.05)
        assert answered == 10, f"still refusing after 30 s: predicted {b.predicted_wait():.2f} s"
        assert b.predicted_wait() < 0.5
        await b.aclose()

    asyncio.run(main())


def test_an_idle_batcher_admits_no_request_with_no_more_time_than_its_answer_needs_to_get_back():
    """The idle rule lets a request past a prediction that may be only history; at c512 behind a
    static tier (the model's queue idle between the few requests the tier leaves it) it let in
    requests with 0-7 ms left, and each timed out: most of the cascade's fallback_timeout."""
    async def main():
        backend = FakeBackend()
        b, obs = await start_batcher(backend, answer_margin_ms=20.0)
        teach(b, 0.5)
        await asyncio.sleep(0.6)  # idle for longer than the 0.5 s it predicts a batch takes
        with pytest.raises(WouldMissDeadline):
            await b.embed("no time", time.monotonic() + 0.01)  # less than the 20 ms margin
        assert "no time" not in backend.tokenized and obs.dropped["overload"] == 1
        # Past the margin but short of the prediction, the idle rule still tries it (and the
        # queue runs it alone: its prediction is history too).
        assert (await b.embed("some time", time.monotonic() + 0.3)).shape == (FakeBackend.dim,)
        await b.aclose()

    asyncio.run(main())


def test_the_queue_does_not_run_alone_an_item_with_no_more_time_than_its_answer_needs():
    from batching.cost_model import BatchCostModel
    from batching.queue import BatchQueue

    now = [1000.0]
    q = BatchQueue(8, 1024, 8, clock=lambda: now[0])
    cost = BatchCostModel()
    for tokens in (4, 8, 16):
        cost.observe(tokens, 0.05)
    now[0] += 1.0  # idle for longer than the 50 ms the cost model predicts a batch takes
    items = []
    for text, left in (("no time", 0.004), ("some time", 0.03)):
        item = q.new_item(text, deadline=now[0] + left, future=None)
        item.inputs = [1, 2]
        assert q.reserve()
        q.put_many([item])
        items.append(item)
    batch = q.next_batch(max_size=1, max_tokens=1024, cost=cost, margin=0.005)
    # Both predicted late (50 ms); the older, with 4 ms left of the 5 ms its answer needs, is
    # refused, and the other, with more than that left, is tried alone.
    assert batch.late == [items[0]] and batch.items == [items[1]]


def test_requests_submitted_together_are_each_queued_or_refused_as_alone():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend, max_batch_size=1, max_queue_requests=2)
        first = await hold_first(b, backend)  # running: it holds no queue slot
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(5)]
        outcomes = b.submit_many([("queued 1", far(), futures[0]), ("no time", float("nan"), futures[1]),
                                  ("queued 2", far(), futures[2]), ("x" * 70_000, far(), futures[3]),
                                  ("one too many", far(), futures[4])])
        kinds = [type(o).__name__ for o in outcomes]
        # two of these fill the two slots; refusals cost none
        assert kinds == ["WorkItem", "DeadlineExceeded", "WorkItem", "TextTooLong", "Overloaded"]
        assert obs.dropped == {"too_long": 1, "overload": 1}
        assert b.depth[0] == 2
        backend.gate.set()
        await first
        np.testing.assert_allclose(await futures[0], vector_for("queued 1"))
        np.testing.assert_allclose(await futures[2], vector_for("queued 2"))
        assert not any(f.done() for f in (futures[1], futures[3], futures[4]))  # refused: told, never settled
        await b.aclose()

    asyncio.run(main())


def test_a_submitted_request_whose_caller_stops_waiting_is_never_computed():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend, max_batch_size=1)
        first = await hold_first(b, backend)
        gone = b.submit("the caller gave up", far(), asyncio.get_running_loop().create_future())
        kept = asyncio.get_running_loop().create_future()
        b.submit("still wanted", far(), kept)
        gone.cancelled = True
        backend.gate.set()
        await first
        np.testing.assert_allclose(await kept, vector_for("still wanted"))
        assert "the caller gave up" not in [t for batch in backend.batches for t in batch]
        assert obs.dropped["cancelled"] == 1
        await b.aclose()

    asyncio.run(main())


def test_an_idle_batcher_admits_the_first_of_a_read_past_an_old_prediction_and_refuses_the_rest():
    async def main():
        backend = FakeBackend()
        b, _ = await start_batcher(backend)
        for i in range(40):  # a model that was slow once: 5 s a batch, whatever its size
            b.cost.observe(8 * (1 + i % 2), 5.0)
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(3)]
        soon = time.monotonic() + 1.0
        b._queue._idle_since -= 60.0  # idle for a minute: longer than its predicted wait
        outcomes = b.submit_many([(f"read {i}", soon, futures[i]) for i in range(3)])
        kinds = [type(o).__name__ for o in outcomes]
        assert kinds == ["WorkItem", "WouldMissDeadline", "WouldMissDeadline"]
        np.testing.assert_allclose(await futures[0], vector_for("read 0"))  # it ran, and the model is relearned
        await b.aclose()

    asyncio.run(main())


async def queue_bulk(b: ContinuousBatcher, backend: FakeBackend, texts: list[str], deadline=None) -> list[asyncio.Task]:
    """Submit `texts` as one request's bulk texts (the prompt guard's pieces) while the model is held."""
    already = len(backend.tokenized)
    tasks = [asyncio.create_task(b.embed(t, deadline or far(), bulk=True)) for t in texts]
    await wait_until(lambda: len(backend.tokenized) == already + len(texts))
    return tasks


def fixed_costs(b: ContinuousBatcher, seconds_per_token: float) -> None:
    """The cost model predicts `seconds_per_token` a padded token and learns nothing more (the fake
    model's batches take no time: they would teach it that batches are free)."""
    for tokens in (4, 8, 16, 32):
        b.cost.observe(tokens, seconds_per_token * tokens)
    b.cost.observe = lambda tokens, seconds: None  # type: ignore[method-assign]


def test_a_prompt_queued_after_another_requests_pieces_goes_first_and_pieces_fill_only_a_slice():
    async def main():
        backend = FakeBackend(hold=True)
        b, _ = await start_batcher(backend, bulk_slice_ms=20)
        fixed_costs(b, 0.001)  # 1 ms a padded token
        first = await hold_first(b, backend)
        pieces = await queue_bulk(b, backend, [f"piece {i} w w w w w w w w" for i in range(30)])  # 10 tokens each
        prompt = await queue_behind(b, backend, ["my own prompt"])
        backend.gate.set()
        await asyncio.gather(first, *pieces, *prompt)
        second = backend.batches[1]
        assert second[0] == "my own prompt"
        # 5 tokens alone (5 ms); pieces (12 tokens) join while they add at most 20 ms: one
        # (2 x 12 = 24 ms); a second would add 31.
        assert len(second) == 2
        # Pieces alone: batches of at most 20 ms (one piece; two are 24 ms), every piece computed once.
        assert all(len(batch) == 1 for batch in backend.batches[2:])
        assert sorted(t for batch in backend.batches[1:] for t in batch) == \
            sorted(["my own prompt"] + [f"piece {i} w w w w w w w w" for i in range(30)])
        await b.aclose()

    asyncio.run(main())


def test_a_prompt_is_admitted_by_the_prompts_queued_not_by_another_requests_pieces():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend)
        teach(b, 0.2)
        first = await hold_first(b, backend)  # predicted to take 0.2 s
        pieces = await queue_bulk(b, backend, [f"piece {i}" for i in range(200)])
        # 200 pieces ahead: four more batches; the prompt waits for none of them.
        assert b.predicted_wait(bulk=True) > 0.7 > b.predicted_wait()
        prompt = asyncio.create_task(b.embed("my own prompt", time.monotonic() + 0.7))
        with pytest.raises(WouldMissDeadline):  # a bulk text is judged by everything queued
            await b.embed("one more piece", time.monotonic() + 0.7, bulk=True)
        backend.gate.set()
        np.testing.assert_allclose(await prompt, vector_for("my own prompt"))
        await asyncio.gather(first, *pieces)
        assert obs.dropped.get("overload") == 1
        assert b.depth == (0, 0)
        await b.aclose()

    asyncio.run(main())


def test_pieces_never_make_a_prompt_in_their_batch_late():
    async def main():
        backend = FakeBackend(hold=True)
        b, obs = await start_batcher(backend, bulk_slice_ms=1000)
        fixed_costs(b, 0.01)  # 10 ms a padded token
        first = await hold_first(b, backend)
        pieces = await queue_bulk(b, backend, [f"piece {i} w w w w w w w w" for i in range(10)])
        prompt = asyncio.create_task(b.embed("my own prompt", time.monotonic() + 0.6))  # ~50 ms alone
        await wait_until(lambda: "my own prompt" in backend.tokenized)
        backend.gate.set()
        np.testing.assert_allclose(await prompt, vector_for("my own prompt"))
        await asyncio.gather(first, *pieces)
        # With it, pieces fit only while the batch still ends by its deadline (3 x 10 tokens = 300 ms).
        assert backend.batches[1][0] == "my own prompt" and len(backend.batches[1]) <= 5
        assert "late" not in obs.dropped
        await b.aclose()

    asyncio.run(main())
