"""Hooks through which the batcher reports what it does; metrics live with the caller."""

from __future__ import annotations

from typing import Protocol, Sequence


class BatchObserver(Protocol):
    """Called from the batcher's threads; implementations must be thread-safe and cheap."""

    def on_batch(
        self, size: int, tokens: int, padded_tokens: int, inference_s: float, queue_waits_s: Sequence[float]
    ) -> None: ...

    def on_dropped(self, reason: str, count: int) -> None:
        """reason is one of: overload (refused at admission), late (refused when its batch was cut:
        predicted to finish after its deadline), expired, cancelled, error."""
        ...

    def on_queue_depth(self, requests: int, tokens: int) -> None: ...

    def on_tokenized(self, by: str, count: int) -> None:
        """by: batcher (texts its tokenizer thread tokenized) or caller (token ids the caller made:
        a pool's front ends, esr_model/token_ids.py)."""
        ...


class NullObserver:
    def on_batch(self, size, tokens, padded_tokens, inference_s, queue_waits_s) -> None:
        pass

    def on_dropped(self, reason, count) -> None:
        pass

    def on_queue_depth(self, requests, tokens) -> None:
        pass

    def on_tokenized(self, by, count) -> None:
        pass
