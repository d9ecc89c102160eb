"""A model process with a model of fixed cost: what the front-end benchmarks put behind the workers,
so that what they measure is the front end, not the model.

    python -m bench.stub_model --socket /tmp/model.sock [--batch-ms 2] [--per-item-us 20]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
from typing import Sequence

import numpy as np

from esr_app.model_process import ModelProcess
from esr_config import load_config
from devstack.stack import ROOT

DIMENSION = 384


class FixedCostBackend:
    """Sleeps batch_ms + per_item_us per item per batch (the GIL is free meanwhile, as under a
    GPU kernel) and answers a unit vector drawn from the text's hash."""

    dimension = DIMENSION
    device = "stub"

    def __init__(self, batch_ms: float, per_item_us: float):
        self.batch_s, self.per_item_s = batch_ms / 1000.0, per_item_us / 1e6

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=8).digest()) for t in texts]

    def embed(self, token_ids: Sequence[Sequence[int]], deadline: float | None = None) -> np.ndarray:
        time.sleep(self.batch_s + self.per_item_s * len(token_ids))
        out = np.empty((len(token_ids), DIMENSION), np.float32)
        for row, ids in enumerate(token_ids):
            out[row] = np.random.default_rng(list(ids)).standard_normal(DIMENSION)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def prepare_thread(self) -> None:
        pass

    def warmup(self) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.stub_model")
    p.add_argument("--socket", required=True)
    p.add_argument("--batch-ms", type=float, default=2.0)
    p.add_argument("--per-item-us", type=float, default=20.0)
    args = p.parse_args()
    backend = FixedCostBackend(args.batch_ms, args.per_item_us)
    process = ModelProcess(load_config(ROOT / "router.yaml"), args.socket, backend_factory=lambda cfg: backend)
    asyncio.run(process.run_until_signal())


if __name__ == "__main__":
    main()
