"""The model runtime and front end, side by side, each in a real router process (cache off, the
default 500 ms deadline) behind its own Envoy whose routes answer directly, driven by `wrk` with
unique prompts; trials interleaved, so all see the same machine. The variants:

  torch              encoder.backend torch on asyncio's loop: the router before ONNX and uvloop
  onnx_fp32          the default: ONNX Runtime, the fp32 export, uvloop
  onnx_int8          encoder.precision int8 (esr_model/quantize.py), uvloop
  onnx_fp32_asyncio  the default on asyncio's loop: what uvloop alone changes

    python -m bench.runtime.runtime_bench [--trials 2] [--seconds 8] [--variants ...] [--out result.json]

Per variant and trial: c1 (one request at a time: latency), c64 (throughput), and c64 with the
model pinned (`"model": "code-model"`: no embedding, the front end alone); the router's CPU per
routed request from /proc (user + system of its process tree, the body parser's worker included)
over the run. Then the model alone, offline, on CLINC150-like prompts: prompts/s at batch 1 and 32.
Checks: the issue's targets (c64 >= 2x, CPU <= 0.5x, c1 p50 <= 0.5x, each the best trial of the
default and of int8 against the best of torch; pinned CPU <= 0.4 ms).
Needs wrk and envoy.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench.harness import start_router
from bench.harness import tree_cpu
from bench.harness import GOOD, WRK_SCRIPT, run_wrk, start_direct_envoy, wrk_workdir
from bench.report import emit
from bench.workloads import WORKLOADS
from devstack.stack import free_port
from esr_config import EncoderConfig

VARIANTS = {
    "torch": ({"backend": "torch"}, {"event_loop": "asyncio"}),
    "onnx_fp32": ({"backend": "onnx", "precision": "fp32"}, {"event_loop": "uvloop"}),
    "onnx_int8": ({"backend": "onnx", "precision": "int8"}, {"event_loop": "uvloop"}),
    "onnx_fp32_asyncio": ({"backend": "onnx", "precision": "fp32"}, {"event_loop": "asyncio"}),
}
DEFAULT = "onnx_fp32"
# The same requests naming a backend model: pinned, no embedding; what the front end costs.
PINNED_SCRIPT = WRK_SCRIPT.replace('{"model":"auto"', '{"model":"code-model"')
COLUMNS = ("backend", "scenario", "throughput_rps", "goodput_rps", "p50_ms", "p99_ms", "cpu_ms_per_request",
           "fallback_timeout_share")


def through_envoy(args, workdir: Path) -> list[dict]:
    script, pinned = workdir / "prompts.lua", workdir / "pinned.lua"
    script.write_text(WRK_SCRIPT)
    pinned.write_text(PINNED_SCRIPT)
    stacks = {}
    try:
        for name in args.variants:
            encoder, server = VARIANTS[name]
            (workdir / name).mkdir()
            proc, port = start_router(workdir / name, "cpu", None, deadline_ms=500, encoder=encoder, server=server)
            stacks[name] = (proc, None, None)
            listener = free_port()
            envoy = start_direct_envoy(workdir / f"envoy-{name}.yaml", port, listener, free_port())
            stacks[name] = (proc, envoy, listener)
            run_wrk(listener, 16, 2, script)  # warm-up
        rows = []
        for trial in range(args.trials):
            for name in args.variants if trial % 2 == 0 else reversed(args.variants):
                proc, _, listener = stacks[name]
                for c, lua, scenario in ((1, script, None), (64, script, None), (64, pinned, "pinned_c64")):
                    before = tree_cpu(proc.pid)
                    row = run_wrk(listener, c, args.seconds, lua, good=("model_pinned",) if scenario else GOOD)
                    routed = row["goodput_rps"] * args.seconds
                    spent = tree_cpu(proc.pid) - before
                    rows.append({"backend": name, "trial": trial, **row, **({"scenario": scenario} if scenario else {}),
                                 "cpu_ms_per_request": round(1000 * spent / routed, 3) if routed else None})
        return rows
    finally:
        for proc, envoy, _ in stacks.values():
            for p in (envoy, proc):
                if p is not None:
                    p.terminate()
                    p.wait(30)


def model_alone(args) -> list[dict]:
    from esr_model.encoder import SentenceEncoder
    from esr_model.onnx_encoder import OnnxEncoder

    encoders = {"torch": SentenceEncoder(EncoderConfig(backend="torch", device="cpu")),
                "onnx_fp32": OnnxEncoder(EncoderConfig(backend="onnx", precision="fp32")),
                "onnx_int8": OnnxEncoder(EncoderConfig(backend="onnx", precision="int8"))}
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
    p = argparse.ArgumentParser(prog="python -m bench.runtime.runtime_bench")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--out")
    args = p.parse_args()
    workdir = wrk_workdir("runtime")
    rows = through_envoy(args, workdir)
    rows += model_alone(args)

    def best(backend: str, scenario: str, key: str, low: bool = False):
        vals = [r[key] for r in rows if r["backend"] == backend and r["scenario"] == scenario and r.get(key) is not None]
        return (min if low else max)(vals) if vals else None

    ratios = {}
    for name in (DEFAULT, "onnx_int8"):
        ratios.update({
            f"routed req/s at c64 through Envoy, {name} / torch (target >= 2.0)":
                (best(name, "envoy_c64", "goodput_rps"), best("torch", "envoy_c64", "goodput_rps"), 2.0, False),
            f"router CPU per routed request at c64, {name} / torch (target <= 0.5)":
                (best(name, "envoy_c64", "cpu_ms_per_request", True), best("torch", "envoy_c64", "cpu_ms_per_request", True), 0.5, True),
            f"c1 p50 latency through Envoy, {name} / torch (target <= 0.5)":
                (best(name, "envoy_c1", "p50_ms", True), best("torch", "envoy_c1", "p50_ms", True), 0.5, True),
        })
    checks = {}
    front_end = best(DEFAULT, "pinned_c64", "cpu_ms_per_request", True)
    checks["router CPU per pinned request (front end alone), target <= 0.4 ms"] = {
        "ok": front_end is not None and front_end <= 0.4, "detail": f"{front_end} ms"}
    for name, (new, old, target, lower) in ratios.items():
        ratio = new / old if new and old else float("nan")
        checks[name] = {"ok": ratio <= target if lower else ratio >= target, "detail": f"{new} vs {old}: {ratio:.2f}x"}
    emit({"benchmark": "runtime", "cpu_count": os.cpu_count(), "rows": rows, "checks": checks}, args.out, columns=COLUMNS)


if __name__ == "__main__":
    main()
