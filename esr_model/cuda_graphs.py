"""The encoder's forward pass on CUDA as captured graphs, one per (batch, length) bucket, replayed
with one host call: eager PyTorch launches ~180 kernels a forward, each a return to Python that
re-takes the GIL beside the busy event loop, so the host, not the GPU, set the pace. A batch is
padded up to its bucket (padding is masked: the rows' embeddings do not change), copied through
pinned host buffers, and only the rows asked for come back.

Captured and checked against eager at load (`capture`); where capture fails or a graph's answer
differs, the encoder runs eagerly, and says why in its log line.
"""

from __future__ import annotations

import bisect
import logging
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
LENGTHS = (16, 32, 64, 128, 256, 512)


def buckets(sizes: tuple[int, ...], most: int) -> tuple[int, ...]:
    """`sizes` up to `most`, and `most` itself where it falls between two."""
    kept = tuple(s for s in sizes if s < most)
    return kept + (most,)


class Buckets:
    """Which captured shape a batch runs in, and the batch padded into it."""

    def __init__(self, max_batch: int, max_length: int, pad_id: int):
        self.batches = buckets(BATCHES, max_batch)
        self.lengths = buckets(LENGTHS, max_length)
        self.pad_id = pad_id

    def shape_for(self, n: int, length: int) -> tuple[int, int] | None:
        """The smallest captured (batch, length) that holds `n` rows of `length`; None: none does."""
        b = bisect.bisect_left(self.batches, n)
        i = bisect.bisect_left(self.lengths, length)
        if b == len(self.batches) or i == len(self.lengths):
            return None
        return self.batches[b], self.lengths[i]

    def fill(self, ids: np.ndarray, mask: np.ndarray, into_ids: np.ndarray, into_mask: np.ndarray) -> None:
        """`ids` and `mask` (n, length) into the top-left of a bucket's buffers; padding elsewhere."""
        n, length = ids.shape
        into_ids.fill(self.pad_id)
        into_mask.fill(0)
        into_mask[:, 0] = 1  # padding rows attend to one token: no row is all-masked (NaN-free softmax)
        into_ids[:n, :length] = ids
        into_mask[:n, :length] = mask


class CudaGraphs:
    """`forward(ids, mask) -> (n, dimension)` tensors on `device`, captured per bucket."""

    def __init__(self, forward: Callable, device: str, max_batch: int, max_length: int, pad_id: int):
        import torch

        self._torch = torch
        self._forward = forward
        self._device = device
        self.buckets = Buckets(max_batch, max_length, pad_id)
        self._graphs: dict[tuple[int, int], tuple] = {}

    def capture(self) -> None:
        """Every bucket's graph, sharing one memory pool; raises what capture raises."""
        torch = self._torch
        side = torch.cuda.Stream(device=self._device)
        pool = None
        with torch.inference_mode():
            for b in self.buckets.batches:
                for length in self.buckets.lengths:
                    ids = torch.full((b, length), self.buckets.pad_id, dtype=torch.long, device=self._device)
                    mask = torch.ones((b, length), dtype=torch.long, device=self._device)
                    side.wait_stream(torch.cuda.current_stream(self._device))
                    with torch.cuda.stream(side):  # warm-up outside capture, as CUDA graphs ask
                        for _ in range(2):
                            self._forward(ids, mask)
                    torch.cuda.current_stream(self._device).wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        out = self._forward(ids, mask)
                    pool = graph.pool()
                    host_ids = torch.empty((b, length), dtype=torch.long, pin_memory=True)
                    host_mask = torch.empty((b, length), dtype=torch.long, pin_memory=True)
                    self._graphs[(b, length)] = (graph, ids, mask, out, host_ids, host_mask)
        torch.cuda.synchronize(self._device)

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray | None:
        """The batch's embeddings (float32, on the host); None where no bucket holds it."""
        shape = self.buckets.shape_for(*ids.shape)
        if shape is None:
            return None
        graph, ids_t, mask_t, out, host_ids, host_mask = self._graphs[shape]
        self.buckets.fill(ids, mask, host_ids.numpy(), host_mask.numpy())
        # The graph's inputs were made in inference mode (capture): only there may they be written.
        with self._torch.inference_mode():
            ids_t.copy_(host_ids, non_blocking=True)
            mask_t.copy_(host_mask, non_blocking=True)
            graph.replay()
            return out[: len(ids)].float().cpu().numpy()  # the one device->host copy (and sync)
