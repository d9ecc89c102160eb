"""The cascade on and off where the encoder runs on CUDA, in process: the routing engine the router
serves (`build_serving`), its continuous batcher and the torch backend on the GPU; no Envoy or
gRPC (a device machine has neither). Labelled prompts (CLINC150 val, shuffled), with the embedding cache
off so each is embedded; trials interleaved, each on another slice:

- c1: one decision at a time, p50 and p99;
- c64: 64 at once, decisions/s and p50;
- accuracy and the static tier's share, on and off.

    python -m bench.cascade.cascade_gpu_bench --config build/clinc150.fitted.yaml --data ../shared/data/clinc150/val.jsonl

On the CPU the cascade is `make bench-cascade` (through Envoy); this says what it buys on a GPU
(docs/static-tier.md, "On a GPU").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.report import emit, latency_stats
from esr_app.embedding import start_batcher
from esr_app.routing_build import build_serving
from esr_config import load_config
from esr_settings import replace_at

COLUMNS = ("variant", "trial", "scenario", "decisions_per_s", "p50_ms", "p99_ms", "accuracy", "static_share")


async def _decide(engine, text: str) -> tuple[float, str, str]:
    started = time.perf_counter()
    d = await engine.decide([text], time.monotonic() + 5.0)
    return time.perf_counter() - started, d.route, d.tier


async def _scenario(engine, rows: list[tuple[str, str]], concurrency: int) -> dict:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, text: str):
        async with gate:
            return await _decide(engine, text)

    started = time.perf_counter()
    out = await asyncio.gather(*(one(i, t) for i, (t, _) in enumerate(rows)))
    wall = time.perf_counter() - started
    lat = latency_stats([s for s, _, _ in out])
    right = np.mean([route == label for (_, route, _), (_, label) in zip(out, rows)])
    return {"scenario": f"c{concurrency}", "decisions_per_s": round(len(rows) / wall, 1), "p50_ms": lat["p50_ms"],
            "p99_ms": lat["p99_ms"], "accuracy": round(float(right), 4),
            "static_share": round(float(np.mean([tier == "static" for _, _, tier in out])), 4)}


async def run(config_path: Path, data: Path, trials: int, c1_n: int, c64_n: int, device: str) -> list[dict]:
    config = load_config(config_path)
    config = replace_at(config, "encoder.device", device)
    config = replace_at(config, "encoder.backend", "torch" if device.startswith("cuda") else "onnx")
    config = replace_at(config, "static_tier.enabled", True)
    config = replace_at(config, "cache_size", 0)
    rows = [(r["text"], r["label"]) for r in map(json.loads, data.read_text().splitlines())]
    rows = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]  # every label in any slice
    batcher = await start_batcher(config)
    engine = (await build_serving(config, batcher, None)).engine
    static = engine.static
    assert static is not None, "the config has no fitted static tier (static_tier.accept)"
    out = []
    engine.static = None  # warm-up: the encoder's batches of each size (CUDA's kernels and allocator)
    await _scenario(engine, rows[:2048], 64)
    await _scenario(engine, rows[:128], 1)
    for trial in range(trials):
        for variant in (("on", "off") if trial % 2 == 0 else ("off", "on")):
            engine.static = static if variant == "on" else None
            for concurrency, n in ((1, c1_n), (64, c64_n)):
                picked = rows[(trial * 997) % len(rows):] + rows
                row = await _scenario(engine, picked[:n], concurrency)
                out.append({"variant": f"cascade_{variant}", "trial": trial, **row})
    await batcher.aclose()
    return out


def _device_name(device: str) -> str:
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cascade.cascade_gpu_bench")
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--c1", type=int, default=400, help="decisions per c1 run")
    p.add_argument("--c64", type=int, default=3000, help="decisions per c64 run")
    p.add_argument("--device", default="cuda", help="cuda (torch), or cpu (onnx) to compare on the same machine")
    p.add_argument("--out")
    args = p.parse_args()
    rows = asyncio.run(run(args.config, args.data, args.trials, args.c1, args.c64, args.device))
    checks = {}
    for scenario, key, better in (("c1", "p50_ms", min), ("c64", "decisions_per_s", max)):
        best = {v: better(r[key] for r in rows if r["variant"] == v and r["scenario"] == scenario)
                for v in ("cascade_on", "cascade_off")}
        checks[f"{scenario} {key}, cascade on / off"] = {
            "ok": True, "detail": f"{best['cascade_on']} vs {best['cascade_off']}: {best['cascade_on'] / best['cascade_off']:.3f}x"}
    emit({"benchmark": "cascade_gpu", "device": _device_name(args.device), "cpu_count": os.cpu_count(),
          "rows": rows, "checks": checks}, args.out, columns=COLUMNS)


if __name__ == "__main__":
    main()
