"""What every local model runtime shares: padding a batch, the thread count measured batch by batch
(esr_model/thread_policy.py), offline encoding in length order, and warm-up."""

from __future__ import annotations

import functools
import itertools
import time
from typing import Sequence

import numpy as np

from esr_model.thread_policy import ThreadTuner
from esr_model.token_ids import read_ids, token_spec, vocab_size
from esr_model.truncation import Keep, cut_ids
from esr_model.wordpiece_cache import WordPieceCache
from esr_model import metrics


def pad(token_ids: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), int64, as long as the longest input."""
    lengths = np.fromiter(map(len, token_ids), np.int64, len(token_ids))
    mask = np.arange(int(lengths.max())) < lengths[:, None]
    ids = np.full(mask.shape, pad_id, dtype=np.int64)
    # One copy of every id, row after row, into the mask's places (row-major, as the rows are):
    # a batch of 64 is padded on the model thread between forward passes.
    ids[mask] = np.fromiter(itertools.chain.from_iterable(token_ids), np.int64, int(lengths.sum()))
    return ids, mask.astype(np.int64)


class TunedEncoder:
    """A Backend (batching/backend.py) on a local model. Subclasses set `cpu_threads`, `pad_id`,
    `dimension`, `max_seq_length`, `keep`, `on_cpu`, `_words` (a WordPieceCache over the model's
    `tokenizers.Tokenizer`) and `_tuner` (None: a fixed count), and implement `_library_ids`,
    `_run(ids, mask)` and `_apply_threads(n)`."""

    cpu_threads: int
    pad_id: int
    dimension: int
    max_seq_length: int
    keep: Keep
    on_cpu: bool
    _words: WordPieceCache
    _tuner: ThreadTuner | None
    _threads_now: int = 0
    # What warmup runs with each thread count the tuner may pick, before the timed singles: a single
    # short request, a full short batch, a long one (length 0: max_seq_length). torch settles its
    # allocator and kernels on these shapes; a runtime that needs no shape warmed names fewer.
    warm_shapes: tuple[tuple[int, int], ...] = ((1, 16), (64, 16), (8, 0))

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        # Whole, then cut here, keeping `keep` (a tokenizer's own truncation keeps only the start).
        # On a GPU the host's Python is the limit: the word cache gives the library's ids for a fifth
        # of its CPU. On a CPU the forward pass is, and the library's call, which lets go of the GIL
        # while it works, leaves more of it to the event loop (docs/benchmarks.md).
        if not self.on_cpu and self._words.usable:
            ids = [self._words.ids(t) for t in texts]
        else:
            ids = self._library_ids(texts)
        return [cut_ids(i, self.max_seq_length, self.keep) for i in ids]

    def token_spec(self) -> dict:
        """Which token ids this model takes from a front end instead of text (the model socket's HELLO)."""
        return token_spec(self._words.tokenizer, self.max_seq_length, self.keep)

    @functools.cached_property
    def _vocab(self) -> int:
        return vocab_size(self._words.tokenizer)

    def read_ids(self, raw: bytes) -> list[int]:
        """A front end's token ids (token_spec), checked; ValueError for ids this model cannot read."""
        return read_ids(raw, self.max_seq_length, self._vocab)

    def _library_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The tokenizer library's ids for `texts`, special tokens included, uncut."""
        raise NotImplementedError

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _apply_threads(self, n: int) -> None:
        raise NotImplementedError

    def _synchronize(self) -> None:
        """Waits for the device where the model runs asynchronously (CUDA): warm-up timings."""

    def prepare_thread(self) -> None:
        if self.on_cpu:
            self._set_threads(self.cpu_threads)

    def _set_threads(self, n: int) -> None:
        if n != self._threads_now:
            self._apply_threads(n)
            self._threads_now = n
            metrics.MODEL_THREADS.set(n)

    def embed(self, token_ids: Sequence[Sequence[int]], deadline: float | None = None) -> np.ndarray:
        ids, mask = pad(token_ids, self.pad_id)
        if self._tuner is None:
            return self._run(ids, mask)
        threads = self._tuner.choose()
        self._set_threads(threads)
        t0 = time.perf_counter()
        out = self._run(ids, mask)
        self._tuner.record(threads, ids.size, time.perf_counter() - t0)
        metrics.THREAD_BATCHES.labels(str(threads)).inc()
        return out

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Embed directly, bypassing the batcher: offline work (CLI, eval, tests) only. Never call
        it in a process whose batcher runs: it would run the model on a second thread."""
        self.prepare_thread()
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        ids = self.tokenize(texts) if texts else []
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            out[chunk] = self.embed([ids[i] for i in chunk])
        return out

    def warmup(self) -> list[tuple[int, float]]:
        self.prepare_thread()
        # Every thread count the tuner may pick, so each is ready (and its pool built) before traffic.
        for threads in self._tuner.candidates if self._tuner else [None]:
            if threads is not None:
                self._set_threads(threads)
            for n, length in self.warm_shapes:
                self._run(*pad([[self.pad_id + 1] * (length or self.max_seq_length)] * n, self.pad_id))
        self.prepare_thread()
        # Then a short and a long single, warm, interleaved, the fastest of five each: how the
        # cost splits into fixed and per-token parts, which traffic of one shape cannot show.
        best: dict[int, float] = {}
        for _ in range(5):
            for length in (16, self.max_seq_length):
                batch = pad([[self.pad_id + 1] * length], self.pad_id)
                t0 = time.perf_counter()
                self._run(*batch)
                self._synchronize()
                best[length] = min(best.get(length, float("inf")), time.perf_counter() - t0)
        return sorted(best.items())
