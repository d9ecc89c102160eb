"""The server's routing decision made offline: `RoutingEngine.decide` itself, embedding through
vectors computed beforehand (eval, fit and replay encode every text once, in batches), so that what
they score is the decision the server makes, by the same code."""

from __future__ import annotations

import asyncio
from typing import Mapping, Sequence

import numpy as np

from batching import ModelUnavailable
from esr_config import RouterConfig
from router.classifier import Decision, RouteClassifier
from router.engine import RoutingEngine
from router.rules import RequestFacts
from router.static_tier import StaticTier


class KnownVectors:
    """An Embedder that answers from vectors computed beforehand; a text it was not given is, to the
    engine, a model that cannot answer (ModelUnavailable), as a server would meet it."""

    def __init__(self, vectors: Mapping[str, np.ndarray]):
        self._vectors = vectors

    async def embed(self, text: str, deadline: float, bulk: bool = False) -> np.ndarray:
        vector = self._vectors.get(text)
        if vector is None:
            raise ModelUnavailable("no vector computed for this text")
        return vector

    async def started(self) -> None:
        return None

    async def aclose(self, drain_timeout: float = 10.0) -> None:
        return None


def decide_requests(config: RouterConfig, classifier: RouteClassifier, requests: Sequence[tuple[Sequence[str], RequestFacts]],
                    vectors: Mapping[str, np.ndarray], static: StaticTier | None = None) -> list[Decision]:
    """The decision of each request (its routed texts, oldest first, and what it asks of a model),
    as the server makes it with `static` as its first tier (None: off) and every text's vector
    at hand. No deadline: offline, the encoder always answers."""
    engine = RoutingEngine(config, KnownVectors(vectors), classifier, static=static)

    async def decide_all() -> list[Decision]:
        return [await engine.decide(list(texts), float("inf"), facts=facts) for texts, facts in requests]

    return asyncio.run(decide_all())
