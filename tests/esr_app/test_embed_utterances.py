"""Embedding a config's utterances (esr_app/routing_build.embed_utterances) waits out an engine that
fails for now, and gives up with the engine's own error once its budget is spent."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from batching import ModelUnavailable, RemoteError
from esr_app.routing_build import embed_utterances


class Flaky:
    """An embedder whose first `failures` calls raise `error`, as a cold remote engine or a
    restarting model process does."""

    def __init__(self, failures: int, error: Exception):
        self.failures, self.error, self.calls = failures, error, 0

    async def embed(self, text: str, deadline: float, bulk: bool = False) -> np.ndarray:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return np.full(3, float(len(text)))


@pytest.mark.parametrize("error", [RemoteError("remote engine: no answer within 2000 ms"),
                                   ModelUnavailable("model process restarting")])
def test_an_engine_failing_for_now_is_waited_out(error):
    embedder = Flaky(failures=3, error=error)
    out = asyncio.run(embed_utterances(embedder, ["a", "bb", "ccc"], step=2))
    assert {t: v[0] for t, v in out.items()} == {"a": 1.0, "bb": 2.0, "ccc": 3.0}
    assert embedder.calls > 3


def test_an_engine_that_keeps_failing_fails_the_build_with_its_error():
    embedder = Flaky(failures=10**6, error=RemoteError("circuit open"))
    with pytest.raises(RemoteError, match="circuit open"):
        asyncio.run(embed_utterances(embedder, ["a"], step=1, budget_s=0.3))


def test_bad_input_is_not_retried():
    embedder = Flaky(failures=10**6, error=ValueError("the remote engine refused the inputs"))
    with pytest.raises(ValueError):
        asyncio.run(embed_utterances(embedder, ["a"], step=1))
    assert embedder.calls == 1
