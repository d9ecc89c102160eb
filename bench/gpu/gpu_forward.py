"""The encoder's forward pass alone on a CUDA device, captured graphs against eager, short unique
prompts: per batch size, the wall time of one `embed` (padding, copies, the forward, the vectors
back), the GPU's own time for it (CUDA events), the host's share (wall - GPU), and embeddings/s.
Trials interleave the two ways.

    python -m bench.gpu.gpu_forward [--model PATH] [--batches 1 16 64 128] [--repeats 50]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench.report import emit

COLUMNS = ("way", "batch", "wall_ms", "gpu_ms", "host_ms", "embeddings_per_s", "tokens")


def _encoder(model: str, graphs: bool):
    from esr_model.config import ModelConfig
    from esr_model.encoder import SentenceEncoder

    return SentenceEncoder(ModelConfig(model=model, device="cuda", backend="torch", cuda_graphs=graphs))


def _measure(encoder, batches: list[list[int]], torch) -> tuple[float, float]:
    """(mean wall, mean GPU) seconds of one embed per batch."""
    walls, gpus = [], []
    for ids in batches:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        encoder.embed(ids)
        end.record()
        walls.append(time.perf_counter() - t0)
        end.synchronize()
        gpus.append(start.elapsed_time(end) / 1000.0)
    return float(np.mean(walls)), float(np.mean(gpus))


def main() -> None:
    import torch

    from tests.support.traffic import prompts

    p = argparse.ArgumentParser(prog="python -m bench.gpu.gpu_forward")
    p.add_argument("--model", default="bundled:all-MiniLM-L6-v2")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 128])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()
    encoders = {"graphs": _encoder(args.model, True), "eager": _encoder(args.model, False)}
    if encoders["graphs"]._graphs is None:
        print("cuda graphs were not captured (see the log): both rows run eagerly")
    texts = prompts(sum(args.batches) * args.repeats * args.trials * 2 + 1024, seed=int(time.time()))
    ids = encoders["eager"].tokenize(texts)
    for encoder in encoders.values():  # warm: every bucket and the allocator
        for n in args.batches:
            _measure(encoder, [ids[:n]] * 3, torch)
    rows, at = [], 0
    for trial in range(args.trials):
        for way in ("graphs", "eager") if trial % 2 == 0 else ("eager", "graphs"):
            for n in args.batches:
                batches = [ids[at + i * n: at + (i + 1) * n] for i in range(args.repeats)]
                at += n * args.repeats
                wall, gpu = _measure(encoders[way], batches, torch)
                rows.append({"way": way, "trial": trial, "batch": n, "wall_ms": round(wall * 1000, 3),
                             "gpu_ms": round(gpu * 1000, 3), "host_ms": round(max(0.0, wall - gpu) * 1000, 3),
                             "embeddings_per_s": round(n / wall, 1),
                             "tokens": round(float(np.mean([len(t) for b in batches for t in b])), 1)})
    emit({"bench": "gpu_forward", "device": torch.cuda.get_device_name(), "rows": rows}, args.out, COLUMNS)


if __name__ == "__main__":
    main()
