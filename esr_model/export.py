"""Exports a sentence-transformers model to ONNX in its own directory, fp32 and int8 per token
(esr_model/quantize.py): torch at build time, so serving needs only ONNX Runtime and the tokenizer
(esr_model/onnx_encoder.py). Both graphs are checked before they replace an older export.
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

from esr_model.encoder import check_batches, forward_module, sentence_embeddings
from esr_model.location import EXPORT_SOURCE, export_is_current, export_path, export_source
from esr_model.quantize import activation_ranges, calibration, quantize_per_token
from esr_model.torch_threads import single_threaded

log = logging.getLogger(__name__)

OPSET = 17
CHECK_ATOL = 1e-4
# int8 against fp32, per vector: the bundled model's lowest is 0.994 on CLINC150 prompts
INT8_MIN_COSINE = 0.98
# int8 alone against int8 in a padded batch: the same arithmetic, so equal but for float rounding
INT8_BATCH_COSINE = 0.9999


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
    tmp_int8 = tmp + ".int8"
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
        tok = model.tokenizer
        # ids from 1,000 up: BERT-family vocabularies start with reserved and special tokens
        calib = calibration(tok.cls_token_id or 101, tok.sep_token_id or 102, min(1000, len(tok) // 10),
                            min(20000, len(tok)))
        quantize_per_token(tmp, tmp_int8, activation_ranges(tmp, calib))
        _check_int8(tmp_int8, tmp, batches)
        for path in (tmp, tmp_int8):
            os.chmod(path, 0o644)  # mkstemp's 0600 would hide the model from a non-root server
        os.replace(tmp, target)
        os.replace(tmp_int8, export_path(model_dir, "int8"))
    finally:
        for path in (tmp, tmp_int8):
            if os.path.exists(path):
                os.unlink(path)
    (target.parent / EXPORT_SOURCE).write_text(json.dumps(export_source(model_dir)) + "\n")
    log.info("model exported to ONNX", extra={"path": str(target.parent), "bytes": target.stat().st_size,
                                               "int8_bytes": export_path(model_dir, "int8").stat().st_size})
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


def _check_int8(path: str, fp32_path: str, batches: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Close to fp32, and each row of a padded batch equal to the same prompt embedded alone."""
    import onnxruntime as ort

    int8, fp32 = (ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for p in (path, fp32_path))
    for ids, mask in batches:
        got = _unit(int8.run(None, {"input_ids": ids, "attention_mask": mask})[0])
        want = _unit(fp32.run(None, {"input_ids": ids, "attention_mask": mask})[0])
        closest = float((got * want).sum(axis=1).min())
        if closest < INT8_MIN_COSINE:
            raise RuntimeError(f"the int8 export is too far from fp32 at batch {ids.shape[0]} x {ids.shape[1]} "
                               f"tokens (cosine {closest:.4f} < {INT8_MIN_COSINE})")
        for row in range(ids.shape[0]):
            n = int(mask[row].sum())
            alone = _unit(int8.run(None, {"input_ids": ids[row:row + 1, :n], "attention_mask": mask[row:row + 1, :n]})[0])
            if float((alone[0] * got[row]).sum()) < INT8_BATCH_COSINE:
                raise RuntimeError("the int8 export's vectors depend on the batch: a prompt alone differs from "
                                   f"the same prompt in a batch of {ids.shape[0]} x {ids.shape[1]} tokens")


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=1, keepdims=True)
