"""Exports a sentence-transformers model to ONNX (fp32) in its own directory: torch at build time,
so serving needs only ONNX Runtime and the tokenizer (model/onnx_encoder.py).

fp32 only, by measurement (README, "Model runtime"): dynamic int8 quantizes each MatMul's input
with one scale over the whole batch tensor, so a prompt's embedding moves with its neighbours
(cosine 0.984 alone vs beside one long odd-script prompt); static int8 has fixed scales but
moved embeddings too far from the model's (mean cosine 0.990 with the FFN outputs kept fp32).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

import torch  # noqa: F401  (import errors first: a torch-free install has no exporter)

from model.location import EXPORT_SOURCE, export_is_current, export_path, export_source

log = logging.getLogger(__name__)

OPSET = 17
# The export is checked against the torch model on these (batch, length) shapes, padding inside.
CHECK_SHAPES = ((1, 3), (3, 16), (5, 41), (2, 128))
CHECK_ATOL = 1e-4


def ensure_export(model_dir: str, force: bool = False) -> tuple[Path, bool]:
    """The model's ONNX file, exported now if missing or made from other weights. -> (path, exported)"""
    if not force and export_is_current(model_dir):
        return export_path(model_dir), False
    return export(model_dir), True


def export(model_dir: str) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer

    from model.encoder import sentence_embeddings
    from model.torch_threads import single_threaded

    import transformers

    transformers.utils.logging.disable_progress_bar()  # no progress bars in structured logs
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    target = export_path(model_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with single_threaded():
        model = SentenceTransformer(model_dir, device="cpu").eval()

    class Forward(torch.nn.Module):  # (input_ids, attention_mask) -> unit-length float32 rows
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return sentence_embeddings(self.model, input_ids, attention_mask)

    pad_id = model.tokenizer.pad_token_id or 0
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings: the check below is what counts
            ids, mask = _inputs(2, 16, pad_id)
            torch.onnx.export(
                Forward().eval(), (torch.from_numpy(ids), torch.from_numpy(mask)), tmp,
                input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
                              "embedding": {0: "batch"}},
                opset_version=OPSET, dynamo=False,
            )
        _check(tmp, model, pad_id)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    (target.parent / EXPORT_SOURCE).write_text(json.dumps(export_source(model_dir)) + "\n")
    log.info("model exported to ONNX", extra={"path": str(target), "bytes": target.stat().st_size})
    return target


def _inputs(n: int, length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n * 1000 + length)
    ids = rng.integers(1000, 20000, size=(n, length), dtype=np.int64)
    mask = np.ones((n, length), dtype=np.int64)
    if n > 1:  # padding inside the batch: the mask must be honoured
        mask[0, length // 2:] = 0
        ids[0, length // 2:] = pad_id
    return ids, mask


def _check(path: str, model, pad_id: int) -> None:
    import onnxruntime as ort
    import torch

    from model.encoder import sentence_embeddings

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n, length in CHECK_SHAPES:
        length = min(length, model.max_seq_length)
        ids, mask = _inputs(n, length, pad_id)
        (got,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
        with torch.inference_mode():
            want = sentence_embeddings(model, torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        if got.shape != want.shape or not np.allclose(got, want, atol=CHECK_ATOL):
            raise RuntimeError(f"the ONNX export differs from the torch model at batch {n} x {length} tokens "
                               f"(max abs difference {np.abs(got - want).max():.2e})")
