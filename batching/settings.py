"""The batcher's tuning: one validated type, also read as the `batching:` section of a config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from esr_settings import SettingError


CPU_PADDING = 0.25
CPU_BATCH = 64
GPU_BATCH = 128  # the largest batch the CUDA graphs are captured for (esr_model/encoder.py)


@dataclass(frozen=True)
class BatcherSettings:
    # Requests per batch. auto: CPU_BATCH, or GPU_BATCH where the model runs on a GPU
    # (esr_app.embedding.batcher_shape), whose forward of 128 short prompts costs ~1.5x one of 64.
    max_batch_size: int | Literal["auto"] = "auto"
    max_batch_tokens: int = 16384  # padded: longest sequence x batch size
    max_queue_requests: int = 2048
    max_queue_tokens: int = 262144
    # Longer texts are refused at submission (TextTooLong), before any tokenizer work: the router's
    # own are bounded far below it (routed texts, guard pieces), as the model socket's frames are.
    max_text_chars: int = 64 * 1024
    sort_window: int = 256  # oldest requests among which batches are sorted by length
    # Share of a batch's padded tokens allowed to be padding. auto: CPU_PADDING, or 1.0 where the
    # model runs on a GPU (esr_app.embedding.batcher_shape): a CPU pays for every padded token, a
    # GPU runs a wide batch in about the time of a narrow one and wants its batches large.
    max_padding: float | Literal["auto"] = "auto"
    max_wait_ms: float = 0.0  # optional top-up wait for small batches; 0 = never wait idle
    # Time an embedding needs after its batch to reach the caller, on top of the measured delay
    # of the event loop in running the settling callback; deadline checks keep both in hand.
    answer_margin_ms: float = 5.0
    # The most predicted time bulk texts (many from one request: the prompt guard's pieces) add to a
    # batch, and the length of a batch of them alone: about the longest a request's own prompt waits
    # behind another request's pieces (batching/queue.py).
    bulk_slice_ms: float = 20.0

    def __post_init__(self):
        if self.max_batch_size != "auto" and not (isinstance(self.max_batch_size, int) and self.max_batch_size >= 1):
            raise SettingError("max_batch_size", "must be auto or at least 1")
        for name in ("max_batch_tokens", "max_queue_requests", "max_queue_tokens", "sort_window",
                     "max_text_chars"):
            if getattr(self, name) < 1:
                raise SettingError(name, "must be at least 1")
        for name in ("max_wait_ms", "answer_margin_ms", "bulk_slice_ms"):
            if getattr(self, name) < 0:
                raise SettingError(name, "must not be negative")
        if self.max_padding != "auto" and not (isinstance(self.max_padding, (int, float))
                                               and 0.0 <= self.max_padding <= 1.0):
            raise SettingError("max_padding", "must be auto or between 0 and 1")
        if self.max_batch_size != "auto" and self.max_queue_requests < self.max_batch_size:
            raise SettingError("max_queue_requests", "must be >= max_batch_size")

    @property
    def batch_size(self) -> int:
        """`max_batch_size` as a count; auto where nobody resolved it for a device is the CPU's."""
        return min(CPU_BATCH, self.max_queue_requests) if self.max_batch_size == "auto" else self.max_batch_size

    @property
    def padding(self) -> float:
        """`max_padding` as a share; auto where nobody resolved it for a device is the CPU's."""
        return CPU_PADDING if self.max_padding == "auto" else self.max_padding

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000.0

    @property
    def answer_margin_s(self) -> float:
        return self.answer_margin_ms / 1000.0
