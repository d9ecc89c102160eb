"""Test doubles for the model side only (the batcher, router and service under test are real)."""

from __future__ import annotations

import threading
import zlib
from typing import Sequence

import numpy as np

from esr_config import parse_config

POISON = "poison"


class FakeBackend:
    """One token id per word (a growing vocabulary, so two texts never share ids); the
    embedding encodes the text so results can be checked.

    `gate` (when set) holds the model thread inside `embed` so tests can make requests
    pile up deterministically.
    """

    dim = 64

    def __init__(self, hold: bool = False):
        self.batches: list[list[str]] = []
        self.tokenized: list[str] = []
        self.gate = threading.Event()
        self.entered = threading.Event()
        if not hold:
            self.gate.set()
        self._lock = threading.Lock()
        self._texts: dict[tuple[int, ...], str] = {}
        self._vocab: dict[str, int] = {}

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        out = []
        for t in texts:
            ids = self.ids_for(t)
            with self._lock:
                self.tokenized.append(t)
            out.append(ids)
        return out

    def ids_for(self, text: str) -> list[int]:
        """The ids `tokenize` gives `text`, without counting it as tokenized here (what a front end
        that has this tokenizer makes)."""
        with self._lock:
            ids = [101] + [self._vocab.setdefault(w, 1000 + len(self._vocab)) for w in text.split()] + [102]
            self._texts[tuple(ids)] = text
        return ids

    def embed(self, token_ids: Sequence[Sequence[int]], deadline: float | None = None) -> np.ndarray:
        texts = [self._texts[tuple(ids)] for ids in token_ids]
        self.entered.set()
        self.gate.wait(30)
        if POISON in texts:
            raise ValueError("poisoned batch")
        with self._lock:
            self.batches.append(texts)
        return np.stack([vector_for(t) for t in texts])

    def prepare_thread(self) -> None:
        pass

    def warmup(self) -> None:
        pass


class IdsBackend(FakeBackend):
    """A FakeBackend that also takes token ids a front end made (Backend.read_ids), at most 64 of them."""

    spec = {"digest": "fake", "max": 64, "keep": "head", "vocab": 1 << 20}

    def token_spec(self) -> dict:
        return dict(self.spec)

    def read_ids(self, raw: bytes) -> list[int]:
        from esr_model.token_ids import read_ids

        return read_ids(raw, self.spec["max"], self.spec["vocab"])

    def front_end(self, spec: dict | None):
        """A ModelClient's token_ids for a front end that has this backend's tokenizer."""
        import array

        if not spec or spec.get("digest") != self.spec["digest"]:
            return None
        return lambda text: array.array("I", self.ids_for(text)).tobytes()


def vector_for(text: str) -> np.ndarray:
    # Seeded by a stable digest of the text, not hash(): Python salts str hashes per process, and a
    # test's vectors (what it routes, what a quality model predicts) must be the same in every run.
    rng = np.random.default_rng(zlib.crc32(text.encode("utf-8", "surrogatepass")))
    v = rng.standard_normal(FakeBackend.dim).astype(np.float32)
    return v / np.linalg.norm(v)


# Toy vectors in three dimensions, placed by hand: `m*` near math, `c*` near code, `g1` near neither.
def unit(*xs):
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


VECTORS = {
    "m1": unit(1, 0, 0), "m2": unit(1, 0.2, 0), "m3": unit(0.2, 1, 0.1),
    "c1": unit(0, 1, 0), "c2": unit(0, 1, 0.3),
    "g1": unit(0, 0, 1),
}


def scatter(rng, center, n, spread):
    """`n` unit vectors around `center`, each drawn with its own Gaussian offset (std `spread`)."""
    out = []
    for _ in range(n):
        v = center + rng.normal(0, spread, 3)
        out.append(v / np.linalg.norm(v))
    return out


def encode(texts):
    return np.stack([VECTORS[t] for t in texts])


def config(**over):
    base = {
        "routes": [
            {"name": "math", "model": "math-model", "utterances": ["m1", "m2", "m3"]},
            {"name": "code", "model": "code-model", "utterances": ["c1", "c2"]},
        ],
        "default_route": {"name": "general", "model": "general-model"},
        "default_threshold": 0.8,
    }
    base.update(over)
    return parse_config(base)
