"""The model runtime, side by side: encoder.backend onnx (the CPU default) against torch, each in a
real router process (cache off, the default 500 ms deadline) behind its own Envoy whose routes answer
directly, driven by `wrk` with unique prompts; trials interleaved, so both see the same machine.

    python -m bench.runtime_bench [--trials 3] [--seconds 8] [--out result.json]

Per backend and trial: c1 (one request at a time: latency), c64 (throughput); the router's CPU per
routed request from its /proc utime + stime over the run. Then the model alone, offline, on CLINC150-
like prompts: prompts/s at batch 1 and 32. Checks: the issue's targets (c64 >= 2x, CPU <= 0.5x,
c1 p50 <= 0.5x, each the best trial of onnx against the best of torch). Needs wrk and envoy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.ext_proc_bench import start_router
from bench.overload_bench import WRK_SCRIPT, run_wrk, start_direct_envoy
from bench.report import emit
from bench.workloads import WORKLOADS
from devstack.stack import free_port
from router.config import EncoderConfig

BACKENDS = ("torch", "onnx")
COLUMNS = ("backend", "scenario", "throughput_rps", "goodput_rps", "p50_ms", "p99_ms", "cpu_ms_per_request",
           "fallback_timeout_share")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def through_envoy(args, workdir: Path) -> list[dict]:
    script = workdir / "prompts.lua"
    script.write_text(WRK_SCRIPT)
    stacks = {}
    try:
        for backend in BACKENDS:
            (workdir / backend).mkdir()
            proc, port = start_router(workdir / backend, "cpu", None, deadline_ms=500, encoder={"backend": backend})
            stacks[backend] = (proc, None, None)
            listener = free_port()
            envoy = start_direct_envoy(workdir / f"envoy-{backend}.yaml", port, listener, free_port())
            stacks[backend] = (proc, envoy, listener)
            run_wrk(listener, 16, 2, script)  # warm-up
        rows = []
        for trial in range(args.trials):
            for backend in BACKENDS if trial % 2 == 0 else reversed(BACKENDS):
                proc, _, listener = stacks[backend]
                for c in (1, 64):
                    before = cpu_seconds(proc.pid)
                    row = run_wrk(listener, c, args.seconds, script)
                    routed = row["goodput_rps"] * args.seconds
                    spent = cpu_seconds(proc.pid) - before
                    rows.append({"backend": backend, "trial": trial, **row,
                                 "cpu_ms_per_request": round(1000 * spent / routed, 3) if routed else None})
        return rows
    finally:
        for proc, envoy, _ in stacks.values():
            for p in (envoy, proc):
                if p is not None:
                    p.terminate()
                    p.wait(30)


def model_alone(args) -> list[dict]:
    from model.encoder import SentenceEncoder
    from model.onnx_encoder import OnnxEncoder

    encoders = {"torch": SentenceEncoder(EncoderConfig(backend="torch", device="cpu")),
                "onnx": OnnxEncoder(EncoderConfig(backend="onnx"))}
    texts = WORKLOADS["short"](512, seed=7)
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.trials):
        for name, enc in encoders.items():
            enc.prepare_thread()
            ids = enc.tokenize(texts)
            for batch, n in ((1, 128), (32, 512)):
                t0 = time.perf_counter()
                for i in range(0, n, batch):
                    enc.embed(ids[i:i + batch])
                rate = n / (time.perf_counter() - t0)
                best[name, batch] = max(best.get((name, batch), 0.0), rate)
    return [{"backend": name, "scenario": f"model_b{batch}", "throughput_rps": round(rate, 1)}
            for (name, batch), rate in best.items()]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.runtime_bench")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--out")
    args = p.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("the runtime benchmark needs wrk: apt-get install wrk")
    workdir = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    rows = through_envoy(args, workdir)
    rows += model_alone(args)

    def best(backend: str, scenario: str, key: str, low: bool = False):
        vals = [r[key] for r in rows if r["backend"] == backend and r["scenario"] == scenario and r.get(key) is not None]
        return (min if low else max)(vals) if vals else None

    ratios = {
        "routed req/s at c64 through Envoy, onnx / torch (target >= 2.0)":
            (best("onnx", "envoy_c64", "goodput_rps"), best("torch", "envoy_c64", "goodput_rps"), 2.0, False),
        "router CPU per routed request at c64, onnx / torch (target <= 0.5)":
            (best("onnx", "envoy_c64", "cpu_ms_per_request", True), best("torch", "envoy_c64", "cpu_ms_per_request", True), 0.5, True),
        "c1 p50 latency through Envoy, onnx / torch (target <= 0.5)":
            (best("onnx", "envoy_c1", "p50_ms", True), best("torch", "envoy_c1", "p50_ms", True), 0.5, True),
    }
    checks = {}
    for name, (new, old, target, lower) in ratios.items():
        ratio = new / old if new and old else float("nan")
        checks[name] = {"ok": ratio <= target if lower else ratio >= target, "detail": f"{new} vs {old}: {ratio:.2f}x"}
    emit({"benchmark": "runtime", "cpu_count": os.cpu_count(), "rows": rows, "checks": checks}, args.out, columns=COLUMNS)


if __name__ == "__main__":
    main()
