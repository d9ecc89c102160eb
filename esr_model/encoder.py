"""Loads a sentence-transformers model and exposes it as a batching Backend."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from esr_model import cpu_quota
from esr_model.location import resolve_model
from esr_model import metrics
from esr_model.config import ModelConfig
from esr_model.thread_policy import ThreadTuner, model_cpus
from esr_model.token_ids import plain
from esr_model.truncation import Keep
from esr_model.wordpiece_cache import WordPieceCache
from esr_model.tuned import TunedEncoder
from esr_model.torch_threads import single_threaded

log = logging.getLogger(__name__)


def resolve_device(spec: str) -> str:
    import torch

    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"encoder.device: {spec!r} asked for but no CUDA device is available")
    return spec


class SentenceEncoder(TunedEncoder):
    """A sentence-transformers model (torch) driven one padded batch at a time.

    Only the batcher's model thread calls `embed`; `tokenize` is safe from another thread
    because fast tokenizers hold no shared mutable state across calls.
    """

    def __init__(self, config: ModelConfig, keep: Keep = "head", front_end_cpus: int = 0):
        """`keep`: the tokens of a text longer than max_seq_length it reads (requests.truncate);
        `front_end_cpus`: CPUs of the budget kept from the model's threads (model_cpus)."""
        self.keep = keep
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        model_path = resolve_model(config.model)
        if Path(model_path).is_dir():
            # A local model never needs the network; don't let a library try.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        import transformers
        from sentence_transformers import SentenceTransformer

        transformers.utils.logging.disable_progress_bar()  # no progress bars in structured logs

        self._torch = torch
        self.device = resolve_device(config.device)
        budget = cpu_quota.detect()
        # Fixed when configured; otherwise up to the CPUs the process may really use, the count
        # measured batch by batch (esr_model/thread_policy.py).
        self.cpu_threads = config.cpu_threads or model_cpus(budget.cpus, front_end_cpus)
        self._tuner = ThreadTuner(self.cpu_threads) if config.cpu_threads is None and self.device == "cpu" else None
        with single_threaded():  # the loading thread must not keep a torch thread pool (see torch_threads)
            self.model = SentenceTransformer(model_path, device=self.device)
            self.model.eval()
            self.half = self.device.startswith("cuda") and config.half_precision
            self.cpu_bf16 = self.device == "cpu" and config.cpu_bf16
            if self.half:
                self.model.half()
        own: int = self.model.max_seq_length
        self.max_seq_length = min(config.max_seq_length or own, own)
        self.tokenizer = self.model.tokenizer
        self.pad_id = self.tokenizer.pad_token_id or 0
        self._words = WordPieceCache(plain(self.tokenizer.backend_tokenizer))
        self.on_cpu = self.device == "cpu"
        self.dimension: int = self.model.get_embedding_dimension()
        self._traced = None
        if config.torchscript and self.device == "cpu" and not self.cpu_bf16:
            with single_threaded():
                self._traced = trace(self.model, self.max_seq_length)
        self._graphs = None
        if config.cuda_graphs and self.device.startswith("cuda"):
            self._graphs = captured(self.model, self.device, self.max_seq_length)
        metrics.CPU_BUDGET.set(budget.cpus)
        log.info(
            "encoder loaded",
            extra={"model": config.model, "device": self.device, "half": self.half, "max_seq_length": self.max_seq_length,
                   "cpu_affinity": budget.affinity, "cpu_quota": budget.quota, "cpu_budget": budget.cpus,
                   "cpu_budget_from": budget.source,
                   "model_threads": self.cpu_threads if self.device == "cpu" else None,
                   "model_threads_adaptive": self._tuner is not None, "torchscript": self._traced is not None,
                   "cuda_graphs": self._graphs is not None},
        )

    def _apply_threads(self, n: int) -> None:
        # torch's intra-op thread count is per calling thread: set where the model runs, and only
        # there (esr_model/torch_threads.py says why).
        self._torch.set_num_threads(n)

    def _synchronize(self) -> None:
        if self.device.startswith("cuda"):
            self._torch.cuda.synchronize()

    def _library_ids(self, texts: Sequence[str]) -> list[list[int]]:
        out = self.tokenizer(list(texts), truncation=False, padding=False, return_attention_mask=False, verbose=False)
        return out["input_ids"]

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        torch = self._torch
        if self._traced is not None:
            # One call that drops the GIL once: every eager op after it would drop and re-take it,
            # and each re-take can wait a whole switch interval (5 ms) behind the busy event loop.
            with torch.inference_mode():
                return self._traced(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        if self._graphs is not None:
            out = self._graphs.run(ids, mask)
            if out is not None:  # None: a batch no bucket holds, run eagerly
                return out
        ids_t = torch.from_numpy(ids).to(self.device, non_blocking=True)
        mask_t = torch.from_numpy(mask).to(self.device, non_blocking=True)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cpu_bf16):
            # The only device->host copy (and sync) per batch.
            return sentence_embeddings(self.model, ids_t, mask_t).cpu().numpy()


def sentence_embeddings(model, input_ids, attention_mask):
    """Unit-length float32 sentence embeddings: what every path (eager, traced) returns."""
    import torch

    emb = model({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]
    return torch.nn.functional.normalize(emb.float(), dim=-1)


def forward_module(model):
    """`model` as a module of (input_ids, attention_mask) -> sentence_embeddings: the signature a
    TorchScript trace and an ONNX export need."""
    import torch

    class Forward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return sentence_embeddings(self.model, input_ids, attention_mask)

    return Forward().eval()


def check_batches(model, max_seq_length: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(input_ids, attention_mask) batches a converted model (trace, export) is checked on against the
    eager one: odd and full lengths, token ids drawn from the vocabulary, the first row half padding
    (the mask must be honoured)."""
    pad_id = model.tokenizer.pad_token_id or 0
    top = min(20000, len(model.tokenizer))
    out = []
    for n, length in ((1, 3), (3, 16), (5, 41), (2, max_seq_length)):
        ids = np.random.default_rng(n * 1000 + length).integers(pad_id + 1, top, size=(n, length), dtype=np.int64)
        mask = np.ones((n, length), dtype=np.int64)
        mask[0, length // 2 :] = 0
        ids[0, length // 2 :] = pad_id
        out.append((ids, mask))
    return out


def captured(model, device: str, max_seq_length: int):
    """The model's forward as CUDA graphs (esr_model/cuda_graphs.py), or None where capture fails
    or a graph's answer differs from eager's on the check batches."""
    import torch

    from esr_model.cuda_graphs import CudaGraphs

    graphs = CudaGraphs(lambda ids, mask: sentence_embeddings(model, ids, mask), device, 128, max_seq_length,
                        model.tokenizer.pad_token_id or 0)
    try:
        graphs.capture()
        for ids, mask in check_batches(model, max_seq_length):
            got = graphs.run(ids, mask)  # outside inference mode, as the model thread calls it
            with torch.inference_mode():
                want = sentence_embeddings(model, torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device))
                want = want.float().cpu().numpy()
                if got is None or got.shape != want.shape or (got * want).sum(-1).min() < 0.999:
                    log.warning("cuda graphs differ from the eager model; running eager")
                    return None
    except Exception as exc:  # a model or torch that cannot be captured still runs, eagerly
        log.warning("cuda graph capture failed; running eager", extra={"error": f"{type(exc).__name__}: {exc}"[:300]})
        return None
    return graphs


def trace(model, max_seq_length: int):
    """The model as one TorchScript graph, or None where tracing fails or changes the output.

    Why: eager PyTorch returns to Python (and takes the GIL) between every op, and the router's
    event loop holds the GIL while it answers requests; the traced graph runs in C++
    (docs/notes/benchmarks-history.md, `bench.overload.contention_bench --torchscript on|off`: faster alone and
    beside a neighbour). The trace is checked against eager on several shapes before use.
    """
    import torch

    batches = [(torch.from_numpy(ids), torch.from_numpy(mask)) for ids, mask in check_batches(model, max_seq_length)]
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings: the check below is what counts
            traced = torch.jit.freeze(torch.jit.trace(forward_module(model), batches[1], check_trace=False, strict=False))
            for ids, mask in batches:
                got, want = traced(ids, mask), sentence_embeddings(model, ids, mask)
                if got.shape != want.shape or not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                    log.warning("torchscript trace differs from the eager model; running eager")
                    return None
    except Exception as exc:  # any model a trace cannot follow still runs, eagerly
        log.warning("torchscript trace failed; running eager", extra={"error": type(exc).__name__})
        return None
    return traced
