"""What the model process costs per embedding when the model is not the limit: the real
`ModelProcess`, model socket and tokenizer, with a stand-in device whose forward pass costs a fixed
time per batch and releases the GIL (as a GPU kernel does). Front ends are `ModelClient`s in
another process, `--callers` requests in flight, every prompt unique. Per trial and variant:

- embeddings/s;
- the model process's CPU per embedding (its forward costs none: what remains is Python);
- the busiest thread's CPU per embedding, and which thread it is;
- mean batch size.

Variants: `cpu` and `gpu`, the batching settings the router resolves for a CPU and for a CUDA
device (`esr_app.embedding.batcher_shape`); front ends send token ids, as a router's do
(esr_model/token_ids.py), or with `+text` (`gpu+text`) the texts. Trials interleave the variants.

    python -m bench.batcher.model_process_bench [--callers 64] [--seconds 4] [--forward-ms 1] [--trials 2]
    python -m bench.batcher.model_process_bench --model cuda --variants gpu --loaders 4   # on a GPU

`--model cuda`: the bundled model itself on the GPU in fp16 (--model-dir: another copy of it), its
batches counted; the figures are then the model process's real throughput.
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
    from esr_model.tuned import TunedEncoder

    real = make_backend(_config("stand-in", "cpu", None))

    class StandInDevice(TunedEncoder):
        cpu_threads, on_cpu, _tuner = 1, False, None
        pad_id, dimension, max_seq_length = real.pad_id, real.dimension, real.max_seq_length

        def __init__(self):
            self.device = device
            self.batches = self.items = 0
            rng = np.random.default_rng(0)
            rows = rng.standard_normal((4096, self.dimension)).astype(np.float32)
            self._rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
            self._mix = rng.integers(1, 1 << 20, self.max_seq_length, dtype=np.int64)

        keep, _words, _library_ids = real.keep, real._words, real._library_ids  # tokenizes as on a GPU

        def _run(self, ids, mask):
            time.sleep(forward_ms / 1000.0)
            self.batches += 1
            self.items += len(ids)
            # one of 4096 unit vectors by the text's ids: texts differ, as a model's answers do; one
            # numpy call a batch, not Python per row (the issue counts the forward as no CPU)
            return self._rows[(ids @ self._mix[: ids.shape[1]]) % len(self._rows)]

        def warmup(self):
            return [(16, forward_ms / 1000.0), (256, forward_ms / 1000.0 + 1e-6)]

    return StandInDevice()


class _Counted:
    """A real backend, its batches and items counted."""

    def __init__(self, backend):
        self._backend = backend
        self.batches = self.items = 0

    def embed(self, token_ids, deadline=None):
        out = self._backend.embed(token_ids, deadline)
        self.batches += 1
        self.items += len(token_ids)
        return out

    def __getattr__(self, name):
        return getattr(self._backend, name)


def _config(model: str, device: str, model_dir: str | None, max_batch: int | None = None):
    from esr_config import load_config
    from esr_settings import replace_at
    from devstack.stack import ROOT

    config = replace_at(load_config(ROOT / "router.yaml"), "encoder.device", device)
    if model == "cuda":
        config = replace_at(config, "encoder", backend="torch", half_precision=True)
    if model_dir:
        config = replace_at(config, "encoder", model=model_dir)
    if max_batch:
        queue = max(config.batching.max_queue_requests, max_batch)
        config = replace_at(config, "batching", max_batch_size=max_batch, max_queue_requests=queue)
    return config


def serve(args) -> None:
    """The model process under test; writes its batch counts to `stats` every 0.2 s."""
    from esr_app import event_loop
    from esr_app.embedding import make_backend
    from esr_app.model_process import ModelProcess

    config = _config(args.model, args.device, args.model_dir, args.max_batch)
    backend = _stand_in(args.device, args.forward_ms) if args.model == "stand-in" else _Counted(make_backend(config))
    stats = args.stats

    def report() -> None:
        while True:
            names = {str(t.native_id): t.name for t in threading.enumerate()}
            Path(stats + ".tmp").write_text(json.dumps({"batches": backend.batches, "items": backend.items,
                                                        "threads": names}))
            os.replace(stats + ".tmp", stats)
            time.sleep(0.2)

    threading.Thread(target=report, daemon=True).start()
    event_loop.run(ModelProcess(config, args.socket, backend_factory=lambda cfg: backend).run_until_signal(),
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


async def _load(socket: str, callers: int, seconds: float, start_at: float, texts: list[str],
                token_ids=None) -> tuple[int, int]:
    """(answers, errors) from `callers` requests kept in flight for `seconds` from `start_at`;
    `token_ids`: what the client makes token ids with (ModelClient), None: it sends text."""
    from esr_modelsock.client import ModelClient

    client = ModelClient(socket, token_ids=token_ids)
    client.start()
    await asyncio.wait_for(client.started(), 60)
    feed = iter(texts)
    done = [0, 0]
    await asyncio.sleep(max(0.0, start_at - time.time()))
    stop = time.monotonic() + seconds

    async def caller() -> None:
        while time.monotonic() < stop and (text := next(feed, None)) is not None:  # never a prompt twice
            try:
                await client.embed(text, time.monotonic() + 2.0)
                done[0] += 1
            except Exception:
                done[1] += 1

    await asyncio.gather(*(caller() for _ in range(callers)))
    await client.aclose(1.0)
    return done[0], done[1]


def load_main(args) -> None:
    """One load generator (a front end's client, on a front end's loop), its counts as JSON."""
    from esr_app import event_loop
    from tests.support.traffic import prompts

    texts = prompts(args.most, args.seed)
    token_ids = None
    if args.sends == "ids":
        from esr_app.embedding import front_end_tokens

        token_ids = front_end_tokens(_config(args.model, "cpu", args.model_dir))
    answers, errors = event_loop.run(_load(args.socket, args.callers, args.seconds, args.start_at, texts, token_ids),
                                     "auto")
    print(json.dumps({"answers": answers, "errors": errors}))


def _loaders(args, socket: str, seconds: float, seed: int, prepare_s: float, sends: str
             ) -> tuple[list[subprocess.Popen], float]:
    start_at = time.time() + prepare_s
    model = ["--model", args.model] + (["--model-dir", args.model_dir] if args.model_dir else [])
    procs = [subprocess.Popen(
        [sys.executable, "-m", "bench.batcher.model_process_bench", "load", "--socket", socket, "--callers",
         str(args.callers), "--seconds", str(seconds), "--start-at", str(start_at), "--seed", str(seed + i),
         "--most", str(args.most), "--sends", sends, *model], stdout=subprocess.PIPE, text=True)
        for i in range(args.loaders)]
    return procs, start_at


def _counts(procs: list[subprocess.Popen]) -> tuple[int, int]:
    results = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    return sum(r["answers"] for r in results), sum(r["errors"] for r in results)


def _trial(variant: str, trial: int, args) -> dict:
    variant_settings, _, sends = variant.partition("+")
    settings, _, max_batch = variant_settings.partition(":")
    device = "cuda" if settings == "gpu" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        socket, stats = f"{tmp}/model.sock", f"{tmp}/stats.json"
        serve_args = ["--model", args.model, "--device", device, "--forward-ms", str(args.forward_ms)]
        if max_batch:
            serve_args += ["--max-batch", max_batch]
        if args.model_dir:
            serve_args += ["--model-dir", args.model_dir]
        proc = subprocess.Popen([sys.executable, "-m", "bench.batcher.model_process_bench", "serve", "--socket", socket,
                                 "--stats", stats, *serve_args])
        try:
            until = time.monotonic() + 600
            while not Path(socket).exists() or not Path(stats).exists():
                if proc.poll() is not None or time.monotonic() > until:
                    raise RuntimeError("the model process did not start")
                time.sleep(0.2)
            seed = (trial * 2 + (device == "cuda")) * 1000 + len(variant) + int(time.time()) * 100_000
            sends = sends or "ids"
            _counts(_loaders(args, socket, 1.0, seed, 1.0, sends)[0])  # warm: connected, first batches run
            procs, start_at = _loaders(args, socket, args.seconds, seed + 500, args.prepare_s, sends)
            time.sleep(max(0.0, start_at - time.time()))
            before_stats = json.loads(Path(stats).read_text())
            before = _cpu(proc.pid, before_stats["threads"])
            began = time.monotonic()
            time.sleep(args.seconds)
            after = _cpu(proc.pid, before_stats["threads"])
            after_stats = json.loads(Path(stats).read_text())
            window = time.monotonic() - began
            answers, errors = _counts(procs)
        finally:
            proc.terminate()
            proc.wait(30)
    answers = int(answers * min(1.0, window / args.seconds))  # those inside the CPU window
    per = 1e6 / max(answers, 1)
    threads = {name: (after[1].get(name, 0.0) - before[1].get(name, 0.0)) * per for name in after[1]}
    busiest = max(threads, key=threads.get)
    batches = max(after_stats["batches"] - before_stats["batches"], 1)
    return {"variant": variant, "trial": trial, "embeddings_per_s": round(answers / args.seconds, 1),
            "process_us": round((after[0] - before[0]) * per, 1), "busiest_us": round(threads[busiest], 1),
            "busiest_thread": busiest, "mean_batch": round((after_stats["items"] - before_stats["items"]) / batches, 1),
            "errors": errors, "threads_us": {k: round(v, 1) for k, v in sorted(threads.items()) if v > 0}}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.batcher.model_process_bench")
    p.add_argument("mode", nargs="?", default="bench", choices=("bench", "serve", "load"))
    p.add_argument("--model", default="stand-in", choices=("stand-in", "cuda"),
                   help="stand-in: a forward pass that sleeps --forward-ms; cuda: the bundled model on the GPU")
    p.add_argument("--model-dir", help="encoder.model for --model cuda (default: the bundled one)")
    p.add_argument("--loaders", type=int, default=1, help="load-generator processes, --callers each")
    p.add_argument("--prepare-s", type=float, default=14.0, help="time the load generators get to make prompts")
    # 60,000 once capped a trial at 15,000 embeddings/s (the prompts ran out within --seconds 4)
    p.add_argument("--most", type=int, default=150_000, help="prompts each load generator makes")
    p.add_argument("--start-at", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--callers", type=int, default=64)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--forward-ms", type=float, default=1.0)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--variants", default="cpu,gpu",
                   help="cpu, gpu: the batching settings the router resolves for each; gpu:128, cpu:32...: "
                        "with that batching.max_batch_size; +text (gpu+text): front ends send text, not token ids")
    p.add_argument("--sends", default="ids", choices=("ids", "text"), help="(load) what the front end sends")
    p.add_argument("--max-batch", type=int, help="(serve) batching.max_batch_size")
    p.add_argument("--socket")
    p.add_argument("--device", default="cpu")
    p.add_argument("--stats")
    p.add_argument("--out")
    args = p.parse_args()
    if args.mode == "serve":
        serve(args)
        return
    if args.mode == "load":
        load_main(args)
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
