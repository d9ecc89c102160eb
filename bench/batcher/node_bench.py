"""One node as deployed: N front-end processes (a router pool, `server.workers: N`) feeding one model
process over its socket (`encoder.socket`), loaded by load-generator processes that speak ext_proc
as Envoy does (headers, then the body, one stream per request; every prompt unique). Per trial,
front-end count and static tier (on/off, interleaved):

- decisions/s, and p50/p99 of a decision at that load;
- CPU per decision of the front ends and of the model process;
- how many requests fell back (undecided by the model in time).

    python -m bench.batcher.node_bench --model stand-in [--front-ends 1 2] [--seconds 6] [--trials 2]
    python -m bench.batcher.node_bench --model cuda --front-ends 4 8 --loaders 4    # a GPU node

`stand-in`: a model process whose forward pass sleeps --forward-ms per batch, GIL released (what a
CPU machine can measure of the node's host side); `cuda`: the bundled model on the GPU, in fp16.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.harness import tree_cpu
from bench.report import emit, latency_stats
from devstack.stack import ROOT, free_port

COLUMNS = ("model", "front_ends", "static", "trial", "decisions_per_s", "p50_ms", "p99_ms", "front_end_us",
           "model_us", "loader_us", "fallbacks", "errors")
def _config(workdir: Path, socket: str, front_ends: int, static: bool, device: str, model_dir: str | None) -> Path:
    config = yaml.safe_load((ROOT / "router.yaml").read_text())
    if model_dir:
        config["encoder"]["model"] = model_dir
    config["cache_size"] = 0
    config["static_tier"] = {**config.get("static_tier", {}), "enabled": static}
    config["server"]["workers"] = front_ends
    config["encoder"]["device"] = device
    config["encoder"]["socket"] = socket
    path = workdir / f"router-{front_ends}-{int(static)}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _start_model(kind: str, workdir: Path, args) -> tuple[subprocess.Popen, str]:
    socket = str(workdir / "model.sock")
    if kind == "stand-in":
        cmd = [sys.executable, "-m", "bench.batcher.model_process_bench", "serve", "--socket", socket, "--device", "cuda",
               "--forward-ms", str(args.forward_ms), "--stats", str(workdir / "stats.json")]
    else:
        config = yaml.safe_load((ROOT / "router.yaml").read_text())
        config["encoder"].update({"device": "cuda", "backend": "torch", "half_precision": True})
        if args.model_dir:
            config["encoder"]["model"] = args.model_dir
        (workdir / "model.yaml").write_text(yaml.safe_dump(config))
        cmd = [sys.executable, "-m", "esr_app", "model-server", "--config", str(workdir / "model.yaml"), "--socket", socket,
               "--metrics-port", str(free_port()), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    until = time.monotonic() + 600
    while not Path(socket).exists():
        if proc.poll() is not None or time.monotonic() > until:
            raise RuntimeError(f"model process ({kind}) did not start")
        time.sleep(0.2)
    return proc, socket


def _start_front_ends(config: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "esr_app", "serve", "--config", str(config), "--grpc-port", str(port),
         "--metrics-port", str(free_port()), "--log-level", "warning"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    for line in proc.stdout:
        if line.startswith("router ready"):
            return proc, port
    raise RuntimeError(f"front ends on {config} did not start")


async def _load(port: int, streams: int, seconds: float, start_at: float, texts: list[str]) -> dict:
    from bench.harness import ExtProcClient

    client = ExtProcClient(port)
    feed = iter(texts)
    latencies: list[float] = []
    errors = 0
    await asyncio.sleep(max(0.0, start_at - time.time()))
    stop = time.monotonic() + seconds

    async def one_stream() -> None:
        nonlocal errors
        while time.monotonic() < stop and (text := next(feed, None)) is not None:  # never a prompt twice
            began = time.perf_counter()
            try:
                await client.route(text)
                latencies.append(time.perf_counter() - began)
            except Exception:
                errors += 1

    await asyncio.gather(*(one_stream() for _ in range(streams)))
    await client.channel.close()
    return {"answers": len(latencies), "errors": errors, "latencies": latencies,
            "reasons": dict(client.reasons)}


def loader_main(args) -> None:
    from esr_app import event_loop
    from tests.support.traffic import prompts

    texts = prompts(args.most, args.seed)
    began = time.process_time()
    out = event_loop.run(_load(args.port, args.streams, args.seconds, args.start_at, texts), "auto")
    out["cpu_s"] = time.process_time() - began  # is the load generator the limit? (its CPU per answer)
    Path(args.result).write_text(json.dumps(out))  # a file: a pipe's reader may see a long line cut


def _trial(model: str, socket: str, model_pid: int, workdir: Path, front_ends: int, static: bool, trial: int,
           args) -> dict:
    proc, port = _start_front_ends(_config(workdir, socket, front_ends, static, "cpu", args.model_dir))
    try:
        from bench.harness import ExtProcClient

        async def warm() -> None:
            client = ExtProcClient(port)
            await asyncio.gather(*(client.route(f"warm up request {i} for trial {trial}") for i in range(64)))
            await client.channel.close()

        asyncio.run(warm())
        start_at = time.time() + args.prepare_s
        seed = int(time.time()) * 100 + trial * 10
        loaders = [subprocess.Popen(
            [sys.executable, "-m", "bench.batcher.node_bench", "load", "--port", str(port), "--streams", str(args.streams),
             "--seconds", str(args.seconds), "--start-at", str(start_at), "--seed", str(seed + i),
             "--most", str(args.most), "--result", str(workdir / f"load-{i}.json")], cwd=ROOT)
            for i in range(args.loaders)]
        time.sleep(max(0.0, start_at - time.time()) + 0.5)  # measure inside the loaded window
        before = (tree_cpu(proc.pid), tree_cpu(model_pid), time.monotonic())
        time.sleep(max(0.5, args.seconds - 1.0))
        after = (tree_cpu(proc.pid), tree_cpu(model_pid), time.monotonic())
        for loader in loaders:
            loader.wait(timeout=args.seconds + args.prepare_s + 120)
        results = [json.loads((workdir / f"load-{i}.json").read_text()) for i in range(args.loaders)]
    finally:
        proc.terminate()
        proc.wait(60)
    answers = sum(r["answers"] for r in results)
    rate = answers / args.seconds
    window = rate * (after[2] - before[2])
    lat = latency_stats([x for r in results for x in r["latencies"]])
    reasons: dict[str, int] = {}
    for r in results:
        for k, v in r["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
    return {"model": model, "front_ends": front_ends, "static": "on" if static else "off", "trial": trial,
            "decisions_per_s": round(rate, 1), "p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"],
            "front_end_us": round((after[0] - before[0]) / max(window, 1) * 1e6, 1),
            "model_us": round((after[1] - before[1]) / max(window, 1) * 1e6, 1),
            "loader_us": round(sum(r["cpu_s"] for r in results) / max(answers, 1) * 1e6, 1),
            "fallbacks": sum(v for k, v in reasons.items() if k.startswith("fallback")),
            "errors": sum(r["errors"] for r in results), "reasons": reasons}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.batcher.node_bench")
    p.add_argument("mode", nargs="?", default="bench", choices=("bench", "load"))
    p.add_argument("--model", default="stand-in", choices=("stand-in", "cuda"))
    p.add_argument("--front-ends", type=int, nargs="+", default=[1, 2])
    p.add_argument("--static", nargs="+", default=["on", "off"], choices=("on", "off"))
    p.add_argument("--loaders", type=int, default=1, help="load-generator processes")
    p.add_argument("--streams", type=int, default=64, help="requests in flight per load generator")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--prepare-s", type=float, default=8.0, help="time the load generators get to make their prompts")
    p.add_argument("--most", type=int, default=40_000, help="prompts each load generator makes")
    p.add_argument("--forward-ms", type=float, default=1.0)
    p.add_argument("--model-dir", help="encoder.model (default: the bundled one)")
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--port", type=int)
    p.add_argument("--start-at", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result", help="(load) where the load generator writes its answers")
    p.add_argument("--out")
    args = p.parse_args()
    if args.mode == "load":
        loader_main(args)
        return
    workdir = Path(tempfile.mkdtemp(prefix="bench-node-"))
    model, socket = _start_model(args.model, workdir, args)
    rows = []
    try:
        variants = [(n, s == "on") for n in args.front_ends for s in args.static]
        for trial in range(args.trials):
            for front_ends, static in variants if trial % 2 == 0 else variants[::-1]:
                rows.append(_trial(args.model, socket, model.pid, workdir, front_ends, static, trial, args))
    finally:
        model.terminate()
        model.wait(60)
    emit({"bench": "node", "model": args.model, "cpus": os.cpu_count(), "loaders": args.loaders,
          "streams": args.streams, "rows": rows}, args.out, COLUMNS)


if __name__ == "__main__":
    main()
