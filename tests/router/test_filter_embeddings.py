"""A filter's own texts (the guard's pieces) share the batcher with everyone's: one request's
thousands of pieces never fill its queue for the others."""

from __future__ import annotations

import asyncio
import time

from batching import BatcherSettings, ContinuousBatcher
from filters.context import RequestContext
from router.classifier import RouteClassifier
from router.engine import RoutingEngine
from tests.support.fakes import FakeBackend, config, encode


def test_a_request_with_many_pieces_holds_one_wave_of_queue_slots():
    async def main():
        backend = FakeBackend(hold=True)  # the model is busy: whatever is submitted stays queued
        batcher = ContinuousBatcher(backend, BatcherSettings(max_batch_size=8, max_queue_requests=256))
        batcher.start()
        cfg = config()
        engine = RoutingEngine(cfg, batcher, RouteClassifier(cfg, encode))
        deadline = time.monotonic() + 10
        ctx = RequestContext(path="/v1/chat/completions", headers={}, body={}, requested_model=None,
                             deadline=deadline, engine=engine)
        pieces = [f"piece number {i}" for i in range(1280)]  # 20 waves; 5x the queue
        guard = asyncio.create_task(ctx.embeddings(pieces))
        await asyncio.sleep(0.2)
        assert batcher.depth[0] <= 16 + 1  # one wave (and the batch the model holds)
        other = asyncio.create_task(engine.embed("somebody else's prompt", deadline))
        backend.gate.set()
        assert (await other).shape  # not refused for a full queue
        assert len(await guard) == len(pieces)
        await batcher.aclose()

    asyncio.run(main())
