"""The contract between the batcher and whatever model it feeds."""

from __future__ import annotations

from typing import Protocol, Sequence, Sized, TypeVar

import numpy as np


# A backend's input per text: token ids for a local model, what a remote engine is sent.
Inputs = TypeVar("Inputs", bound=Sized)


class Backend(Protocol[Inputs]):
    """A model the batcher drives. Only the batcher's model thread calls `embed`. A backend may also
    have `close()`, which the batcher calls once its lanes have stopped (a remote engine's breaker
    stops probing), and `read_ids(raw: bytes) -> Inputs`: a local model's reading of token ids its
    caller made (a front end of the model process: esr_model/token_ids.py), called on the tokenizer
    thread instead of `tokenize`; it raises ValueError for ids the model cannot read."""

    def tokenize(self, texts: Sequence[str]) -> list[Inputs]:
        """The model's input per text: token ids already truncated to what a local model accepts,
        or whatever a remote engine is sent. len() of each is its token count (exact or estimated),
        the unit of the batcher's budgets and cost model."""
        ...

    def embed(self, inputs: Sequence[Inputs], deadline: float | None = None) -> np.ndarray:
        """One float32 row per input, in input order. Pads internally. `deadline` (monotonic) is
        the latest of the batch's deadlines: work that can stop early (a remote call) stops by then.
        Raising a BatcherError says the batch failed for a reason that is not its inputs' (an
        engine that is down): the batcher then does not retry its inputs one by one."""
        ...

    def prepare_thread(self) -> None:
        """Called once on the model thread before its first batch: per-thread runtime settings
        (torch's intra-op thread count is per thread, for one) belong here."""
        ...

    def warmup(self) -> Sequence[tuple[int, float]] | None:
        """Run representative shapes once so the first real batch is not slow. May return (padded
        tokens, seconds) of batches timed once warm, at two sizes or more: the cost model takes from
        them how a batch's cost divides into fixed and per-token parts (BatchCostModel.calibrate)."""
        ...


class Embedder(Protocol):
    """What callers embed through: the batcher in this process, or a client of the batcher in a
    model process (esr_modelsock.client). Both raise BatcherError subclasses, never wait past `deadline`."""

    async def embed(self, text: str, deadline: float, bulk: bool = False) -> np.ndarray:
        """The embedding of `text`; `deadline` is time.monotonic() seconds; `bulk`: one of many
        texts its request sent together, which gives way to requests' own texts (WorkItem.bulk)."""
        ...

    async def started(self) -> None:
        """Returns once embeddings can be asked for."""
        ...

    async def aclose(self, drain_timeout: float = 10.0) -> None:
        ...
