"""The batcher's backend for a remote engine: each batch is one call to the engine's embeddings API,
failures become RemoteError (fallback_remote), and a circuit breaker keeps a down engine uncalled."""

from __future__ import annotations

import http.client
import logging
import os
import time
from typing import Sequence

import numpy as np

from batching import DeadlineExceeded, RemoteError
from esr_remote.breaker import CircuitBreaker
from esr_remote.embeddings_api import EmbeddingsAPI, EngineStatus
from esr_remote import metrics
from esr_remote.config import RemoteEncoderConfig

log = logging.getLogger(__name__)

# Statuses that say these inputs, not the engine, are the problem: the batcher then retries the
# batch's inputs one by one, so that one bad prompt fails alone. Anything else counts against
# the engine (429 included: a breaker that opens gives an overloaded engine room).
_INPUT_REFUSED = frozenset({400, 413, 422})
# How a call fails short of an HTTP status: no connection, a broken exchange, an answer that is
# not embeddings.
_CALL_FAILED = (OSError, http.client.HTTPException, ValueError)
_WAIT_LOG_S = 10.0
# A batch refused as bad input is retried input by input (by the batcher); an engine that refuses
# everything would turn each batch into that many calls. Past this many refusals in a row, each
# counts against the engine, so its breaker opens and the calls stop.
REFUSALS_IN_A_ROW = 8


class RemoteInput:
    """A prompt bound for the engine. len() estimates its tokens (about 4 characters each): the unit
    of the batcher's budgets and cost model; the engine tokenizes for itself."""

    __slots__ = ("text", "_tokens")

    def __init__(self, text: str):
        # A lone surrogate (possible in JSON-escaped input) cannot be sent as UTF-8.
        self.text = text.encode("utf-8", "replace").decode("utf-8")
        self._tokens = 2 + (len(self.text) + 3) // 4

    def __len__(self) -> int:
        return self._tokens


class RemoteBackend:
    device = "remote"

    def __init__(self, config: RemoteEncoderConfig):
        key = None
        if config.api_key_env is not None:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise ValueError(f"encoder.remote.api_key_env: environment variable {config.api_key_env} is not set")
        self.config = config
        self.api = EmbeddingsAPI(config.url, config.model, key)
        self.timeout_s = config.timeout_ms / 1000.0
        self.dimension: int | None = None
        self._refused_in_a_row = 0  # racy across lanes by one at most, like the breaker's count
        self.breaker = CircuitBreaker(self._probe, on_change=lambda is_open: metrics.REMOTE_OPEN.set(int(is_open)))
        metrics.REMOTE_OPEN.set(0)

    def close(self) -> None:
        """No more probes: a backend swapped out on reload, or shut down, stops calling its engine."""
        self.breaker.stop()

    def tokenize(self, texts: Sequence[str]) -> list[RemoteInput]:
        return [RemoteInput(t) for t in texts]

    def embed(self, inputs: Sequence[RemoteInput], deadline: float | None = None) -> np.ndarray:
        if not self.breaker.closed:
            metrics.REMOTE_CALLS.labels("refused").inc()
            raise RemoteError("the remote engine is failing: circuit open, nothing sent")
        timeout = self.timeout_s if deadline is None else min(self.timeout_s, deadline - time.monotonic())
        if timeout <= 0:
            raise DeadlineExceeded("deadline passed before the call")
        metrics.REMOTE_IN_FLIGHT.inc()
        t0 = time.perf_counter()
        try:
            vectors = self.api.embed([i.text for i in inputs], timeout)
        except EngineStatus as exc:
            if exc.status in _INPUT_REFUSED:
                metrics.REMOTE_CALLS.labels("rejected").inc()
                self._refused_in_a_row += 1
                if self._refused_in_a_row > REFUSALS_IN_A_ROW:
                    self.breaker.failed(f"{self._refused_in_a_row} calls in a row refused as bad input")
                    raise RemoteError(f"remote engine refuses every input: {exc}") from None
                self.breaker.succeeded()  # it answered: alive
                raise ValueError(f"the remote engine refused the inputs: {exc}") from None
            raise self._failed("error", str(exc)) from None
        except TimeoutError:
            raise self._failed("timeout", f"no answer within {timeout * 1000:.0f} ms") from None
        except _CALL_FAILED as exc:
            raise self._failed("error", f"{type(exc).__name__}: {exc}") from None
        finally:
            metrics.REMOTE_IN_FLIGHT.dec()
            metrics.REMOTE_CALL.observe(time.perf_counter() - t0)
        if self.dimension is not None and vectors.shape[1] != self.dimension:
            raise self._failed("error", f"dimension changed from {self.dimension} to {vectors.shape[1]}")
        self.breaker.succeeded()
        self._refused_in_a_row = 0
        metrics.REMOTE_CALLS.labels("ok").inc()
        return vectors

    def encode(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Embed directly, bypassing the batcher: offline commands (eval, fit, classify) only."""
        if self.dimension is None:
            self.warmup()
        step = batch_size or self.config.max_batch
        rows = [self.embed(self.tokenize(texts[i : i + step])) for i in range(0, len(texts), step)]
        return np.concatenate(rows) if rows else np.zeros((0, self.dimension or 0), np.float32)

    def _failed(self, outcome: str, why: str) -> RemoteError:
        metrics.REMOTE_CALLS.labels(outcome).inc()
        self.breaker.failed(why)
        return RemoteError(f"remote engine: {why}")

    def _probe(self) -> None:
        self.api.embed(["probe"], self.timeout_s)
        self.api.close()  # the probe thread ends on success: leave no connection behind

    def prepare_thread(self) -> None:
        pass

    def warmup(self) -> None:
        """Waits for the engine (it may start after the router, as beside it in a pod): routes can
        only be built from its embeddings. An engine that answers but refuses is a configuration
        error and fails the start."""
        wait, since, said = 0.25, time.monotonic(), 0.0
        while True:
            try:
                self.dimension = self._first_call().shape[1]
                break
            except EngineStatus as exc:
                if exc.status in (401, 403, 404) or exc.status in _INPUT_REFUSED:
                    raise ValueError(f"encoder.remote: {self.api.url} refused the embeddings call: {exc}") from None
                why = str(exc)
            except _CALL_FAILED as exc:
                why = f"{type(exc).__name__}: {exc}"
            if time.monotonic() - said >= _WAIT_LOG_S:
                said = time.monotonic()
                log.warning("waiting for the remote engine", extra={"url": self.api.url, "error": why,
                                                                     "waited_s": round(said - since, 1)})
            time.sleep(wait)
            wait = min(5.0, 2 * wait)
        self.api.close()
        log.info("remote engine answering", extra={"url": self.api.url, "model": self.config.model,
                                                   "dimension": self.dimension, "encoding": self.api.encoding})

    def _first_call(self) -> np.ndarray:
        try:
            return self.api.embed(["warm up"], self.timeout_s)
        except EngineStatus as exc:
            if exc.status not in _INPUT_REFUSED or self.api.encoding == "float":
                raise
        self.api.encoding = "float"  # an engine without base64 answers: the API's default format
        return self.api.embed(["warm up"], self.timeout_s)
