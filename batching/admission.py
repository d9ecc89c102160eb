"""What admission predicts a new request's wait from: when each lane's running batch should end,
what recent batches looked like, and the batch cost model. Model threads write it as batches start
and end; the event loop reads it per request. One lock makes every read a consistent snapshot."""

from __future__ import annotations

import math
import threading
import time

from batching.cost_model import BatchCostModel
from batching.queue import Batch
from batching.settings import BatcherSettings


class LoadEstimate:
    def __init__(self, settings: BatcherSettings, lanes: int, cost: BatchCostModel):
        self._settings = settings
        self._cost = cost
        self._lock = threading.Lock()
        self._busy_until = [0.0] * lanes
        self._mean_tokens = 16.0
        self._mean_padding = 0.0
        self._mean_batch = 1.0  # requests per batch lately: how fast the queue really drains

    def batch_started(self, lane: int, batch: Batch) -> None:
        with self._lock:
            self._busy_until[lane] = time.monotonic() + batch.predicted_s

    def batch_ended(self, lane: int, batch: Batch, seconds: float | None) -> None:
        """`seconds`: the model time of a batch that ran; None for one that failed (nothing learned)."""
        if seconds is not None:
            self._cost.observe(batch.padded_tokens, seconds)
        with self._lock:
            self._busy_until[lane] = 0.0
            if seconds is not None:
                self._mean_tokens += 0.1 * (batch.tokens / len(batch.items) - self._mean_tokens)
                self._mean_padding += 0.1 * (1.0 - batch.tokens / batch.padded_tokens - self._mean_padding)
                self._mean_batch += 0.2 * (len(batch.items) - self._mean_batch)

    def predicted_wait(self, reserved: int, queued: int, tokens: int, margin: float) -> float:
        """Seconds until a request admitted now would have its embedding, with `reserved` requests
        admitted (this one included), `queued` of them tokenized into `tokens`: until a lane may cut
        a batch, then every batch needed for what is queued, lanes at a time."""
        if not self._cost.ready:
            return 0.0
        s = self._settings
        with self._lock:
            busy_until = list(self._busy_until)
            mean_tokens, mean_padding, mean_batch = self._mean_tokens, self._mean_padding, self._mean_batch
        padded = (tokens + max(0, reserved - queued) * mean_tokens) / max(0.1, 1.0 - mean_padding)
        # Batches cut to their oldest item's deadline can be far below max_batch_size: judge how
        # many it takes to clear the queue by what batches have been, where that is more.
        per_batch = min(s.batch_size, max(mean_batch, reserved / 2))
        batches = max(1, math.ceil(reserved / per_batch), math.ceil(padded / s.max_batch_tokens))
        fixed, per_token = self._cost.coefficients
        # The queue cuts a batch beside a running one only once a full batch waits (BatchQueue.
        # next_batch): short of that, the wait is for every running batch, not for the first.
        free_at = min(busy_until) if reserved >= s.batch_size else max(busy_until)
        running = max(0.0, free_at - time.monotonic())
        rounds = math.ceil(batches / len(busy_until))
        return running + rounds * fixed + per_token * padded / len(busy_until) + margin
