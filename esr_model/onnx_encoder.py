"""A sentence-transformers model's ONNX export (esr_model/export.py) run by ONNX Runtime on the CPU, with
the model's own fast tokenizer: serving on this imports neither torch nor sentence-transformers.

Why ONNX Runtime (docs/notes/benchmarks-history.md, "choosing the model runtime", measured against
TorchScript and OpenVINO): a single prompt embeds faster than on the TorchScript graph, batches as
fast, with the same vectors, and without torch in the install. One session per thread count the
tuner may pick (a session's pool size is fixed when it is made).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from esr_settings import ConfigError

from esr_model import cpu_quota, int8_kernels
from esr_model.location import export_is_current, export_path, export_record, resolve_model
from esr_model.thread_policy import ThreadTuner, model_cpus
from esr_model.truncation import Keep
from esr_model.wordpiece_cache import WordPieceCache
from esr_model.tuned import TunedEncoder
from esr_model import metrics
from esr_model.config import ModelConfig

log = logging.getLogger(__name__)

EXPORT_HINT = "semantic-router export --config CONFIG; make models"


def model_max_seq_length(model_dir: Path) -> int:
    """sentence-transformers' own limit for the model (sentence_bert_config.json), else the tokenizer's."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        try:
            value = json.loads((model_dir / name).read_text()).get(key)
        except (OSError, ValueError):
            continue
        if isinstance(value, int) and 0 < value < 1_000_000:
            return value
    return 512


class OnnxEncoder(TunedEncoder):
    """Only the batcher's model thread calls `embed`; `tokenize` runs on the tokenizer thread (a
    `tokenizers.Tokenizer` is safe to share: encoding keeps no state between calls)."""

    # ONNX Runtime runs a shape the first time as fast as the next, so one short run per thread count
    # builds its pool; larger shapes would only lengthen start-up (docs/notes/benchmarks-history.md).
    warm_shapes = ((1, 16),)

    def __init__(self, config: ModelConfig, keep: Keep = "head", front_end_cpus: int = 0):
        """`keep`: the tokens of a text longer than max_seq_length it reads (requests.truncate);
        `front_end_cpus`: CPUs of the budget kept from the model's threads (model_cpus)."""
        self.keep = keep
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the batcher has a tokenizer thread
        import onnxruntime as ort
        from tokenizers import Tokenizer

        model_dir = Path(resolve_model(config.model))
        if not model_dir.is_dir():
            raise ValueError(f"encoder.model: {config.model!r}: encoder.backend onnx needs a local model directory")
        if not export_is_current(model_dir):
            export_now(config.model, model_dir)
        self._ort = ort
        self.precision = "int8" if config.precision == "int8" else "fp32"
        self._path = str(int8_export(config.model, model_dir) if self.precision == "int8" else export_path(model_dir))
        self.on_cpu = True
        self.device = "cpu"
        budget = cpu_quota.detect()
        self.cpu_threads = config.cpu_threads or model_cpus(budget.cpus, front_end_cpus)
        self._tuner = ThreadTuner(self.cpu_threads) if config.cpu_threads is None else None
        counts = self._tuner.candidates if self._tuner else [self.cpu_threads]
        self._sessions = {n: self._session(n) for n in counts}
        self._session_now = self._sessions[counts[0]]

        limit = model_max_seq_length(model_dir)
        self.max_seq_length = min(config.max_seq_length or limit, limit)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()  # cut in tokenize, keeping `keep`
        self._words = WordPieceCache(self.tokenizer)
        padding = json.loads((model_dir / "tokenizer_config.json").read_text()).get("pad_token") \
            if (model_dir / "tokenizer_config.json").is_file() else None
        self.pad_id = (self.tokenizer.token_to_id(padding) if isinstance(padding, str) else None) or 0
        self.dimension = int(self._run(*_probe(self.pad_id)).shape[1])
        metrics.CPU_BUDGET.set(budget.cpus)
        log.info(
            "encoder loaded",
            extra={"model": config.model, "backend": "onnx", "precision": self.precision, "device": "cpu",
                   "max_seq_length": self.max_seq_length,
                   "cpu_affinity": budget.affinity, "cpu_quota": budget.quota, "cpu_budget": budget.cpus,
                   "cpu_budget_from": budget.source, "front_end_cpus": front_end_cpus, "model_threads": self.cpu_threads,
                   "model_threads_adaptive": self._tuner is not None},
        )

    def _session(self, threads: int):
        ort = self._ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.log_severity_level = 3  # errors only: its warnings are not structured logs
        # Pool threads spinning between ops would burn CPU that the event loop, a neighbour or a CFS
        # quota needs (torch's libgomp pools showed it: esr_model/thread_policy.py). Not yet measured here.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(self._path, opts, providers=["CPUExecutionProvider"])

    def _apply_threads(self, n: int) -> None:
        if n not in self._sessions:  # a count the tuner does not pick (offline use, tests)
            self._sessions[n] = self._session(n)
        self._session_now = self._sessions[n]

    def _library_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        (out,) = self._session_now.run(None, {"input_ids": ids, "attention_mask": mask})  # drops the GIL throughout
        return out


def export_now(spec: str, model_dir: Path) -> None:
    """A model with no current export (fine-tuned, or copied in without one) is exported at load
    where torch is installed: seconds, once. A torch-free install cannot, and says what to run."""
    try:
        from esr_model.export import export
    except ImportError:
        raise ValueError(f"encoder.model: {spec!r} has no current ONNX export in {model_dir / 'onnx'} and torch is "
                         f"not installed to make one ({EXPORT_HINT}, where torch is), or set encoder.backend: torch")
    log.warning("encoder.model has no current ONNX export: exporting it now", extra={"model": spec})
    export(str(model_dir))


def int8_export(spec: str, model_dir: Path) -> Path:
    """The int8 graph, where the export made one and this CPU computes its format exactly (the image's
    build stage may have run on another CPU than the node's); otherwise a ConfigError that says why."""
    record = export_record(model_dir).get("int8") or {}
    here = int8_kernels.this_cpu()
    fmt = record.get("format")
    if fmt not in int8_kernels.FORMATS:
        raise ConfigError(f"encoder.precision: int8 is unavailable for {spec!r}: its export made no int8 graph "
                          f"({record.get('unavailable', 'no record')}; exported on {record.get('cpu', 'an unknown CPU')}). "
                          "Use precision fp32 (the default)")
    if not int8_kernels.is_exact(fmt):
        raise ConfigError(f"encoder.precision: int8: {spec!r}'s int8 graph is {fmt} (made on "
                          f"{record.get('cpu', 'an unknown CPU')}), which ONNX Runtime does not compute exactly on "
                          f"this CPU ({here.cpu}: {here.why}). Re-export it on this CPU ({EXPORT_HINT}) or use "
                          "precision fp32")
    if fmt != here.format:
        log.info("the int8 export is exact here, though made for another CPU: re-exporting here would be faster",
                 extra={"format": fmt, "exported_on": record.get("cpu"), "cpu": here.cpu, "best_format": here.format})
    return export_path(model_dir, "int8")


def _probe(pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((1, 4), pad_id + 1, dtype=np.int64), np.ones((1, 4), dtype=np.int64)
