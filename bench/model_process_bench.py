"""What the model process costs per embedding when the model is not the limit: the real
`ModelProcess`, model socket and tokenizer, with a stand-in device whose forward pass costs a fixed
time per batch and releases the GIL (as a GPU kernel does). Front ends are `ModelClient`s in
another process, `--callers` requests in flight, every prompt unique. Per trial and variant:

- embeddings/s;
- the model process's CPU per embedding (its forward costs none: what remains is Python);
- the busiest thread's CPU per embedding, and which thread it is;
- mean batch size.

Variants: `cpu` and `gpu`, the batching settings the router resolves for a CPU and for a CUDA
device (`esr_app.embedding.batcher_shape`). Trials interleave the variants.

    python -m bench.model_process_bench [--callers 64] [--seconds 4] [--forward-ms 1] [--trials 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.report import emit

COLUMNS = ("variant", "trial", "embeddings_per_s", "process_us", "busiest_us", "busiest_thread", "mean_batch",
           "errors")
TICKS = os.sysconf("SC_CLK_TCK")


def _stand_in(device: str, forward_ms: float):
    """The bundled model's tokenizer and padding, and a forward pass that only sleeps."""
    from esr_app.embedding import make_backend
    from esr_config import load_config
    from esr_model.tuned import TunedEncoder
    from devstack.stack import ROOT

    real = make_backend(load_config(ROOT / "router.yaml"))

    class StandInDevice(TunedEncoder):
        cpu_threads, on_cpu, _tuner = 1, False, None
        pad_id, dimension, max_seq_length = real.pad_id, real.dimension, real.max_seq_length

        def __init__(self):
            self.device = device
            self.batches = self.items = 0
            self._rows = np.ones((4096, self.dimension), np.float32) / np.sqrt(self.dimension)

        def tokenize(self, texts):
            return real.tokenize(texts)

        def _run(self, ids, mask):
            time.sleep(forward_ms / 1000.0)
            self.batches += 1
            self.items += len(ids)
            return self._rows[: len(ids)]

        def warmup(self):
            return [(16, forward_ms / 1000.0), (256, forward_ms / 1000.0 + 1e-6)]

    return StandInDevice()


def serve(socket: str, device: str, forward_ms: float, stats: str) -> None:
    """The model process under test; writes its batch counts to `stats` every 0.2 s."""
    from esr_app import event_loop
    from esr_app.model_process import ModelProcess
    from esr_config import load_config
    from esr_settings import replace_at
    from devstack.stack import ROOT

    backend = _stand_in(device, forward_ms)
    config = replace_at(load_config(ROOT / "router.yaml"), "encoder.device", device)

    def report() -> None:
        while True:
            names = {str(t.native_id): t.name for t in threading.enumerate()}
            Path(stats + ".tmp").write_text(json.dumps({"batches": backend.batches, "items": backend.items,
                                                        "threads": names}))
            os.replace(stats + ".tmp", stats)
            time.sleep(0.2)

    threading.Thread(target=report, daemon=True).start()
    event_loop.run(ModelProcess(config, socket, backend_factory=lambda cfg: backend).run_until_signal(),
                   config.server.event_loop)


def _cpu(pid: int, names: dict[str, str]) -> tuple[float, dict[str, float]]:
    """(the process's CPU seconds, each thread's by its Python name: MainThread runs the event loop)."""
    def ticks(stat: str) -> tuple[str, float]:
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        return name, (int(fields[11]) + int(fields[12])) / TICKS

    threads: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name, seconds = ticks(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
        except FileNotFoundError:
            continue
        name = names.get(tid, name)
        threads[name] = threads.get(name, 0.0) + seconds
    return ticks(Path(f"/proc/{pid}/stat").read_text())[1], threads


async def _load(socket: str, callers: int, seconds: float, seed: int, most_per_s: int = 30_000) -> tuple[int, int]:
    """(answers, errors) from `callers` requests kept in flight for `seconds`."""
    from esr_modelsock.client import ModelClient
    from tests.support.traffic import prompts

    client = ModelClient(socket)
    client.start()
    await asyncio.wait_for(client.started(), 60)
    texts = iter(prompts(int(most_per_s * seconds), seed))
    done = [0, 0]
    stop = time.monotonic() + seconds

    async def caller() -> None:
        while time.monotonic() < stop:
            try:
                await client.embed(next(texts), time.monotonic() + 2.0)
                done[0] += 1
            except Exception:
                done[1] += 1

    await asyncio.gather(*(caller() for _ in range(callers)))
    await client.aclose(1.0)
    return done[0], done[1]


def _run(main):
    """On the loop a front end runs on."""
    from esr_app import event_loop

    return event_loop.run(main, "auto")


def _trial(variant: str, trial: int, args) -> dict:
    device = "cuda" if variant == "gpu" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        socket, stats = f"{tmp}/model.sock", f"{tmp}/stats.json"
        proc = subprocess.Popen([sys.executable, "-m", "bench.model_process_bench", "serve", "--socket", socket,
                                 "--device", device, "--forward-ms", str(args.forward_ms), "--stats", stats])
        try:
            seed = trial * 2 + (variant == "gpu") + int(time.time())
            _run(_load(socket, args.callers, 1.0, seed))  # warm: connected, first batches run
            before_stats = json.loads(Path(stats).read_text())
            before = _cpu(proc.pid, before_stats["threads"])
            answers, errors = _run(_load(socket, args.callers, args.seconds, seed + 7919))
            after = _cpu(proc.pid, before_stats["threads"])
            time.sleep(0.3)
            after_stats = json.loads(Path(stats).read_text())
        finally:
            proc.terminate()
            proc.wait(30)
    per = 1e6 / max(answers, 1)
    threads = {name: (after[1].get(name, 0.0) - before[1].get(name, 0.0)) * per for name in after[1]}
    busiest = max(threads, key=threads.get)
    batches = max(after_stats["batches"] - before_stats["batches"], 1)
    return {"variant": variant, "trial": trial, "embeddings_per_s": round(answers / args.seconds, 1),
            "process_us": round((after[0] - before[0]) * per, 1), "busiest_us": round(threads[busiest], 1),
            "busiest_thread": busiest, "mean_batch": round((after_stats["items"] - before_stats["items"]) / batches, 1),
            "errors": errors, "threads_us": {k: round(v, 1) for k, v in sorted(threads.items()) if v > 0}}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.model_process_bench")
    p.add_argument("mode", nargs="?", default="bench", choices=("bench", "serve"))
    p.add_argument("--callers", type=int, default=64)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--forward-ms", type=float, default=1.0)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--variants", default="cpu,gpu")
    p.add_argument("--socket")
    p.add_argument("--device", default="cpu")
    p.add_argument("--stats")
    p.add_argument("--out")
    args = p.parse_args()
    if args.mode == "serve":
        serve(args.socket, args.device, args.forward_ms, args.stats)
        return
    variants = args.variants.split(",")
    rows = []
    for trial in range(args.trials):
        for variant in variants if trial % 2 == 0 else variants[::-1]:
            rows.append(_trial(variant, trial, args))
    emit({"bench": "model_process", "callers": args.callers, "forward_ms": args.forward_ms, "rows": rows},
         args.out, COLUMNS)


if __name__ == "__main__":
    main()
