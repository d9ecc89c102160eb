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
import torch  # first: an ImportError here says this install (torch-free) has no exporter

from model.encoder import check_batches, forward_module, sentence_embeddings
from model.location import EXPORT_SOURCE, export_is_current, export_path, export_source
from model.torch_threads import single_threaded

log = logging.getLogger(__name__)

OPSET = 17
CHECK_ATOL = 1e-4


def ensure_export(model_dir: str, force: bool = False) -> tuple[Path, bool]:
    """The model's ONNX file, exported now if missing or made from other weights. -> (path, exported)"""
    if not force and export_is_current(model_dir):
        return export_path(model_dir), False
    return export(model_dir), True


def export(model_dir: str) -> Path:
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.utils.logging.disable_progress_bar()  # no progress bars in structured logs
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    target = export_path(model_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with single_threaded():
        model = SentenceTransformer(model_dir, device="cpu").eval()
    batches = check_batches(model, model.max_seq_length)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings: the check below is what counts
            ids, mask = batches[1]
            torch.onnx.export(
                forward_module(model), (torch.from_numpy(ids), torch.from_numpy(mask)), tmp,
                input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
                              "embedding": {0: "batch"}},
                opset_version=OPSET, dynamo=False,
            )
        _check(tmp, model, batches)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    (target.parent / EXPORT_SOURCE).write_text(json.dumps(export_source(model_dir)) + "\n")
    log.info("model exported to ONNX", extra={"path": str(target), "bytes": target.stat().st_size})
    return target


def _check(path: str, model, batches: list[tuple[np.ndarray, np.ndarray]]) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for ids, mask in batches:
        (got,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
        with torch.inference_mode():
            want = sentence_embeddings(model, torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        if got.shape != want.shape or not np.allclose(got, want, atol=CHECK_ATOL):
            raise RuntimeError(f"the ONNX export differs from the torch model at batch {ids.shape[0]} x "
                               f"{ids.shape[1]} tokens (max abs difference {np.abs(got - want).max():.2e})")
