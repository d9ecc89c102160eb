"""Exports a sentence-transformers model to ONNX in its own directory: fp32, checked against torch, and
int8 per token (esr_model/quantize.py) where this CPU computes an int8 format exactly
(esr_model/int8_kernels.py), checked against fp32. torch at build time, so serving needs only ONNX
Runtime and the tokenizer (esr_model/onnx_encoder.py). int8 is optional: where it cannot be made
right, the export says why in one log line and in source.json, and fp32 is exported as ever.
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

from esr_model import int8_kernels
from esr_model.encoder import check_batches, forward_module, sentence_embeddings
from esr_model.location import EXPORT_SOURCE, export_is_current, export_path, export_source
from esr_model.static_embedding import ensure_static
from esr_model.quantize import activation_ranges, calibration, quantize_per_token
from esr_model.torch_threads import single_threaded

log = logging.getLogger(__name__)

OPSET = 17
CHECK_ATOL = 1e-4
# int8 against fp32, per vector, on the check batches (random ids, up to 256 tokens)
INT8_MIN_COSINE = 0.99
# int8 alone against int8 in a padded batch: the same arithmetic, so equal but for float rounding
INT8_BATCH_COSINE = 0.9999


def ensure_export(model_dir: str, force: bool = False) -> tuple[Path, bool]:
    """The model's ONNX file, exported now if missing or made from other weights, and the static
    embedding distilled from it (esr_model/static_embedding.py). -> (path, exported)"""
    if not force and export_is_current(model_dir):
        ensure_static(model_dir)
        return export_path(model_dir), False
    path = export(model_dir)
    ensure_static(model_dir)
    return path, True


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
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the model from a non-root server
        (target.parent / EXPORT_SOURCE).unlink(missing_ok=True)  # not current until the record is written
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    int8 = _export_int8(model_dir, model.tokenizer, batches)
    (target.parent / EXPORT_SOURCE).write_text(json.dumps({**export_source(model_dir), "int8": int8}) + "\n")
    log.info("model exported to ONNX", extra={"path": str(target.parent), "bytes": target.stat().st_size,
                                               "int8_format": int8.get("format")})
    return target


def _export_int8(model_dir: str, tokenizer, batches: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """The int8 graph in a format this CPU computes exactly, checked against fp32: its record for
    source.json, or why there is none. Optional: no outcome here fails the fp32 export."""
    fp32, target = export_path(model_dir), export_path(model_dir, "int8")
    here = int8_kernels.this_cpu()
    fmt = next((f for f in (here.format, *int8_kernels.FORMATS) if int8_kernels.is_exact(f)), None)
    tmp = str(target) + ".tmp"
    try:
        if fmt is None:
            raise RuntimeError(f"ONNX Runtime's int8 GEMM is exact in no format on this CPU ({here.cpu}: {here.why})")
        calib = calibration(tokenizer.cls_token_id or 101, tokenizer.sep_token_id or 102, len(tokenizer))
        quantize_per_token(fp32, tmp, activation_ranges(fp32, calib), fmt)
        closest = _check_int8(tmp, str(fp32), batches)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except RuntimeError as exc:
        target.unlink(missing_ok=True)  # an older int8 graph is not this export's
        log.warning("int8 export not made: encoder.precision int8 is unavailable for this model",
                    extra={"cpu": here.cpu, "reason": str(exc)})
        return {"unavailable": str(exc), "cpu": here.cpu}
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"format": fmt, "cpu": here.cpu, "min_cosine": round(closest, 4)}


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


def _check_int8(path: str, fp32_path: str, batches: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Close to fp32, and each row of a padded batch equal to the same prompt embedded alone.
    -> the lowest cosine to fp32."""
    import onnxruntime as ort

    int8, fp32 = (ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for p in (path, fp32_path))
    lowest = 1.0
    for ids, mask in batches:
        got = _unit(int8.run(None, {"input_ids": ids, "attention_mask": mask})[0])
        want = _unit(fp32.run(None, {"input_ids": ids, "attention_mask": mask})[0])
        closest = float((got * want).sum(axis=1).min())
        lowest = min(lowest, closest)
        if closest < INT8_MIN_COSINE:
            raise RuntimeError(f"the int8 graph is too far from fp32 at batch {ids.shape[0]} x {ids.shape[1]} "
                               f"tokens (cosine {closest:.4f} < {INT8_MIN_COSINE})")
        for row in range(ids.shape[0]):
            n = int(mask[row].sum())
            alone = _unit(int8.run(None, {"input_ids": ids[row:row + 1, :n], "attention_mask": mask[row:row + 1, :n]})[0])
            if float((alone[0] * got[row]).sum()) < INT8_BATCH_COSINE:
                raise RuntimeError("the int8 graph's vectors depend on the batch: a prompt alone differs from "
                                   f"the same prompt in a batch of {ids.shape[0]} x {ids.shape[1]} tokens")
    return lowest


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=1, keepdims=True)
