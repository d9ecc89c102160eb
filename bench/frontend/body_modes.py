"""Routed req/s through Envoy with the request body BUFFERED vs STREAMED vs FULL_DUPLEX_STREAMED, and
ordinary requests beside slow chunked uploads in each streaming mode.

    python -m bench.frontend.body_modes [--seconds 8] [--trials 3] [--concurrency 64] [--out build/bench-body-modes.json]

Three stacks (router.yaml, mock backends, Envoy), one per body mode; new prompts (unique across
clients and runs) at --concurrency, trials interleaved. Then, on each streaming stack: 20 ordinary
requests alone, and again beside 8 uploads each sending 1 MiB in 16 KiB chunks 20 ms apart.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from bench.closed_loop import closed_loop_rps
from bench.report import emit, latency_stats
from devstack.stack import stack_with

PROMPTS = ("solve the equation 2x + 3 = 11", "write a python function that sorts a list", "tell me a joke")


def _routed(http: httpx.Client) -> bool:
    body = {"model": "auto", "messages": [{"role": "user", "content": f"{PROMPTS[hash(uuid.uuid4()) % 3]} "
                                                                   f"{uuid.uuid4().hex}"}]}
    r = http.post("/v1/chat/completions", json=body)
    return r.status_code == 200 and r.headers.get("x-semantic-route-reason") in ("matched", "default")


def ordinary(url: str, n: int = 20) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=60) as http:
        for i in range(n):
            t0 = time.perf_counter()
            assert _routed(http), "an ordinary request was not routed"
            out.append(time.perf_counter() - t0)
    return out


def slow_upload(url: str, stop: threading.Event) -> None:
    filler = "x" * (16 * 1024 - 2)

    def chunks():
        yield b'{"model":"auto","messages":[{"role":"user","content":"'
        for _ in range(64):  # 1 MiB
            if stop.is_set():
                break
            time.sleep(0.02)
            yield filler.encode()
        yield b'"}]}'

    with httpx.Client(base_url=url, timeout=120) as http:
        http.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})


STREAMING = ("streamed", "full_duplex_streamed")


def beside_uploads(url: str) -> tuple[list[float], list[float]]:
    """20 ordinary requests alone, then beside 8 slow 1 MiB uploads."""
    alone = ordinary(url)
    stop = threading.Event()
    uploads = [threading.Thread(target=slow_upload, args=(url, stop)) for _ in range(8)]
    for t in uploads:
        t.start()
    time.sleep(0.3)
    beside = ordinary(url)
    stop.set()
    for t in uploads:
        t.join(timeout=60)
    return alone, beside


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend.body_modes")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--out", default=None)
    args = p.parse_args()

    def mode(name):
        def change(config):
            config.setdefault("envoy", {})["request_body_mode"] = name
        return change

    modes = ("buffered", *STREAMING)
    with contextlib.ExitStack() as stacks:
        stack = {m: stacks.enter_context(stack_with(Path(tempfile.mkdtemp(prefix=f"bench-{m}-")), mode(m)))
                 for m in modes}
        for m in modes:
            ordinary(stack[m].url, 50)  # warm-up
        trials: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.trials):
            for m in modes:
                trials[m].append(round(closed_loop_rps(stack[m].url, args.seconds, args.concurrency, _routed), 1))
        paced = {m: beside_uploads(stack[m].url) for m in STREAMING}
    median = {k: sorted(v)[len(v) // 2] for k, v in trials.items()}
    rows = [{"workload": f"c{args.concurrency}", "scenario": k, "throughput_rps": median[k]} for k in trials]
    checks = {}
    for m in STREAMING:
        alone, beside = paced[m]
        rows += [{"workload": f"{m}, sequential", "scenario": "ordinary, alone", **latency_stats(alone)},
                 {"workload": f"{m}, sequential", "scenario": "ordinary, beside 8 slow 1 MiB uploads",
                  **latency_stats(beside)}]
        ratio = median[m] / median["buffered"]
        checks[f"routed req/s, {m} >= 0.9 x buffered"] = {
            "ok": ratio >= 0.9, "detail": f"{ratio:.2f}x; trials {json.dumps(trials)}"}
        checks[f"{m}: ordinary beside slow uploads, none slower than alone + 100 ms"] = {
            "ok": max(beside) <= max(alone) + 0.1,
            "detail": f"slowest {max(beside) * 1000:.0f} ms beside vs {max(alone) * 1000:.0f} ms alone"}
    emit({"rows": rows, "checks": checks, "trials": trials}, args.out,
         columns=("workload", "scenario", "throughput_rps", "p50_ms", "p95_ms", "p99_ms"))


if __name__ == "__main__":
    main()
