"""A continuous batcher for embedding models: many concurrent callers, one model thread.

Knows nothing of Envoy, HTTP or routes: callers hand it text and a deadline and get back a vector.
"""

from batching.backend import Backend, Embedder
from batching.batcher import ContinuousBatcher
from batching.cost_model import BatchCostModel
from batching.errors import (BatcherClosed, BatcherError, DeadlineExceeded, ModelUnavailable, Overloaded, RemoteError,
                             TextTooLong, WouldMissDeadline)
from batching.observer import BatchObserver, NullObserver
from batching.settings import BatcherSettings

__all__ = [
    "Backend",
    "BatchCostModel",
    "BatcherClosed",
    "BatcherError",
    "BatcherSettings",
    "BatchObserver",
    "ContinuousBatcher",
    "DeadlineExceeded",
    "Embedder",
    "ModelUnavailable",
    "NullObserver",
    "Overloaded",
    "TextTooLong",
    "RemoteError",
    "WouldMissDeadline",
]
