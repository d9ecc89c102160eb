"""A static embedding distilled from the serving encoder: one vector per vocabulary token, so a text
embeds as the mean of its tokens' vectors, with no transformer (router/static_tier.py routes on it).

How it is made (model2vec's method, measured on CLINC150: docs/notes/static-tier-history.md): every token runs
through the encoder's ONNX export alone between [CLS] and [SEP]; the vectors are centred, reduced to
`DIMENSIONS` by PCA, and scaled by a Zipf estimate of how rare the token is (frequent tokens say
least; WordPiece vocabularies are roughly in frequency order). ONNX Runtime only: no torch, no data.
Stored beside the export, with the digest of the weights it came from, so a fine-tuned model gets
its own table. A head config's fit may then train the rows of the tokens its examples use
(esr_tuning/static_table.py): stored beside the config (static_tier.table_path), laid over this
table at load, and refused where the table they were trained from is not this one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from esr_model.location import EXPORT_DIR, export_path, weights_digest
from esr_model.truncation import Keep, cut_ids
from esr_model.wordpiece_cache import WordPieceCache

log = logging.getLogger(__name__)

STATIC_FILE = "static.npz"
STATIC_FORMAT = 1  # bumped when the method changes: an older table is made again
DIMENSIONS = 256
SIF_A = 1e-3  # weight a / (a + p) of a token of estimated probability p (Arora et al., ICLR 2017)
_BATCH = 1024


def static_path(model_dir: str | Path) -> Path:
    return Path(model_dir) / EXPORT_DIR / STATIC_FILE


def _source(model_dir: str | Path) -> str:
    return json.dumps({"format": STATIC_FORMAT, "weights_sha256": weights_digest(model_dir)}, sort_keys=True)


def is_current(model_dir: str | Path) -> bool:
    path = static_path(model_dir)
    try:
        with np.load(path, allow_pickle=False) as data:
            return str(data["source"]) == _source(model_dir)
    except (OSError, KeyError, ValueError):
        return False


def ensure_static(model_dir: str | Path) -> Path:
    """The model's static table, distilled now from its ONNX export if missing or made from other
    weights: a short forward pass per vocabulary token, the slowest step of a fine-tuned model's
    first load (logged with its seconds)."""
    path = static_path(model_dir)
    if is_current(model_dir):
        return path
    if not export_path(model_dir).is_file():
        raise ValueError(f"{model_dir}: no ONNX export to distil a static embedding from (make models)")
    started = time.monotonic()
    table = distill(model_dir)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    os.close(fd)
    try:
        np.savez(tmp, table=table, source=np.asarray(_source(model_dir)))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("static embedding distilled", extra={"path": str(path), "tokens": table.shape[0],
                                                   "dimensions": table.shape[1],
                                                   "seconds": round(time.monotonic() - started, 1)})
    return path


def distill(model_dir: str | Path, dimensions: int = DIMENSIONS) -> np.ndarray:
    return reduced_table(token_vectors(model_dir), dimensions)


def token_vectors(model_dir: str | Path) -> np.ndarray:
    """(vocabulary, encoder dimension): each token's embedding, run through the encoder alone."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    cls, sep = _specials(tokenizer)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(export_path(model_dir)), opts, providers=["CPUExecutionProvider"])
    vocab = tokenizer.get_vocab_size()
    out = []
    for start in range(0, vocab, _BATCH):
        ids = np.arange(start, min(vocab, start + _BATCH), dtype=np.int64)
        batch = np.stack([np.full_like(ids, cls), ids, np.full_like(ids, sep)], axis=1)
        out.append(session.run(None, {"input_ids": batch, "attention_mask": np.ones_like(batch)})[0])
    return np.concatenate(out)


def reduced_table(token_vectors: np.ndarray, dimensions: int = DIMENSIONS) -> np.ndarray:
    """The table: the token vectors centred, reduced by PCA, weighted by how rare each token is."""
    vectors = token_vectors.astype(np.float64)
    vocab = len(vectors)
    vectors -= vectors.mean(axis=0)
    _, _, components = np.linalg.svd(vectors, full_matrices=False)
    reduced = vectors @ components[: min(dimensions, components.shape[0])].T
    rank = np.arange(1, vocab + 1)
    probability = 1.0 / (rank * np.log(1.78 * vocab))  # Zipf's law over the vocabulary's order
    return (reduced * (SIF_A / (SIF_A + probability))[:, None]).astype(np.float32)


def _specials(tokenizer) -> tuple[int, int]:
    ids = tokenizer.encode("").ids  # [CLS] [SEP] for BERT-style tokenizers
    if len(ids) >= 2:
        return ids[0], ids[-1]
    return tokenizer.token_to_id("[CLS]") or 101, tokenizer.token_to_id("[SEP]") or 102


class StaticEncoder:
    """Embeds texts as the unit mean of their tokens' static vectors: tokenization and a gather,
    microseconds a prompt, safe on the event loop for texts the request reader has already cut
    (requests.prompt_max_tokens). Reads the same tokens of a long text as the encoder (`keep`).
    `trained`: a file of trained rows (save_trained) laid over the distilled table."""

    def __init__(self, model_dir: str | Path, max_tokens: int = 256, keep: Keep = "head", trained: str | None = None):
        from tokenizers import Tokenizer

        with np.load(ensure_static(model_dir), allow_pickle=False) as data:
            self.table = data["table"]
            self.source = str(data["source"])  # what the rows trained over it must have been trained from
        self.tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.words = WordPieceCache(self.tokenizer)
        self.max_tokens = max_tokens  # the encoder's window, [CLS] and [SEP] included
        self.keep = keep
        self.dimension = self.table.shape[1]
        # What identifies the table as served, for a head fitted on its vectors (the guard's static
        # screen): what it was made from (weights, method, the rows trained over it), not its values,
        # which another CPU class's GEMM kernels change in the last bits at distillation. A screen
        # fitted on a laptop must stay on in the cluster.
        self.digest = _identity(self.source)
        if trained is not None:
            self._lay(*load_trained(trained, self.source))

    def with_rows(self, rows: np.ndarray, vectors: np.ndarray) -> "StaticEncoder":
        """This encoder with `rows` of its table replaced by `vectors` (fit's trained rows)."""
        other = copy.copy(self)
        other._lay(rows, vectors)
        return other

    def _lay(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        rows, vectors = rows.astype(np.int64), vectors.astype(np.float32)
        self.table = _laid_over(self.table, rows, vectors)
        self.digest = _identity(self.digest, rows, vectors)

    def token_ids(self, text: str) -> list[int]:
        """The tokens the encoder reads of `text` (its own cut), less [CLS] and [SEP], which say nothing."""
        return cut_ids(self.words.ids(text), self.max_tokens, self.keep)[1:-1]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        # One text at a time: encode_batch's thread pool costs more than it saves here.
        if len(texts) == 1:  # a request's own prompt, on the event loop: no list to join
            return self._unit_mean(texts[0])
        return np.concatenate([self._unit_mean(t) for t in texts]) if len(texts) else \
            np.zeros((0, self.dimension), dtype=np.float32)

    def _unit_mean(self, text: str) -> np.ndarray:
        """(1, dimension): the unit mean of the text's token vectors; zeros for a text with no tokens.
        np.mean and np.linalg.norm spelled out: the same float32 arithmetic, bit for bit, without
        their Python wrappers (a third of this on the event loop for each static decision)."""
        ids = self.token_ids(text)
        if not ids:
            return np.zeros((1, self.dimension), dtype=np.float32)
        one = np.add.reduce(self.table[ids], axis=0, keepdims=True)
        one /= len(ids)
        norm = np.sqrt(np.add.reduce(one * one, axis=1, keepdims=True))
        return one / norm if norm[0, 0] != 0 else one


def _identity(base: str, *arrays: np.ndarray) -> str:
    h = hashlib.blake2b(base.encode(), digest_size=12)
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _laid_over(table: np.ndarray, rows: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """A copy of `table` with `rows` replaced by `vectors`: the distilled table, loaded once, is never written."""
    out = table.copy()
    out[rows] = vectors
    return out


def save_trained(path: str | Path, rows: np.ndarray, vectors: np.ndarray, source: str) -> None:
    """Trained rows of the table whose StaticEncoder.source is `source`."""
    np.savez(path, rows=rows.astype(np.int64), vectors=vectors.astype(np.float32), source=np.asarray(source))


def load_trained(path: str | Path, source: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            rows, vectors, trained_from = data["rows"], data["vectors"], str(data["source"])
    except (OSError, KeyError, ValueError) as exc:
        raise ValueError(f"static_tier.table_path: cannot read {path}: {exc}") from None
    if trained_from != source:
        raise ValueError(f"static_tier.table_path: {path} was trained over another encoder's static table "
                         "(a new or re-exported model): fit the static tier again (fit --static-only)")
    return rows, vectors
