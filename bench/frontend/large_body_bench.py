"""Normal traffic's latency while large request bodies arrive, at the router's ext_proc interface.

    python -m bench.frontend.large_body_bench [--seconds 8] [--senders 3] [--out result.json]

A router process (500 ms deadline) takes short chat prompts at concurrency 4, first alone, then
while a separate process keeps `--senders` streams sending 4 MiB bodies (a 3.9 MB array of floats
beside a short prompt) back to back. The target compares p99 with and without them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import HEADERS, ExtProcClient, start_router
from bench.report import emit, latency_stats
from devstack.stack import ROOT

BIG = b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"x":[' + b",".join([b"1.2345678e9"] * 340000) + b"]}"


async def send_big(port: int, seconds: float, senders: int) -> None:
    """Runs in its own process: `senders` streams of large bodies, back to back."""
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    client = ExtProcClient(port)
    end, sent = time.monotonic() + seconds, 0

    async def one():
        nonlocal sent
        while time.monotonic() < end:
            call = client.stub.Process()
            await call.write(HEADERS)
            await call.read()
            await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=BIG, end_of_stream=True)))
            await call.read()
            await call.done_writing()
            sent += 1

    await asyncio.gather(*(one() for _ in range(senders)))
    print(f"BIG {sent / seconds:.2f}", flush=True)


async def normal(client: ExtProcClient, seconds: float, tag: str) -> dict:
    latencies: list[float] = []
    client.reasons.clear()
    end, n = time.monotonic() + seconds, 0

    async def worker():
        nonlocal n
        while time.monotonic() < end:
            n += 1
            t0 = time.perf_counter()
            await client.route(f"solve {n}x + 3 = 7 #{tag}")
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(4)))
    return {"throughput_rps": round(len(latencies) / seconds, 1), **latency_stats(latencies),
            "reasons": dict(client.reasons)}


async def run(args) -> dict:
    proc, port = start_router(Path(tempfile.mkdtemp(prefix="bench-large-body-")), "cpu", None, deadline_ms=500)
    try:
        client = ExtProcClient(port)
        await normal(client, 2, "warm")
        quiet = await normal(client, args.seconds, "quiet")
        sender = subprocess.Popen([sys.executable, "-m", "bench.frontend.large_body_bench", "--send", str(port),
                                   "--seconds", str(args.seconds + 1), "--senders", str(args.senders)],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True, env=os.environ)
        await asyncio.sleep(1)
        busy = await normal(client, args.seconds, "busy")
        big_rate = float(sender.communicate(timeout=120)[0].split()[-1])
    finally:
        proc.terminate()
        proc.wait(30)
    ratio = busy["p99_ms"] / quiet["p99_ms"]
    rows = [{"workload": "short", "scenario": "normal_c4_quiet", **quiet},
            {"workload": "short", "scenario": f"normal_c4_with_{args.senders}_senders", **busy,
             "large_bodies_per_s": big_rate}]
    return {"benchmark": "large_body", "cpu_count": os.cpu_count(), "body_bytes": len(BIG), "rows": rows,
            "checks": {"p99 with large bodies <= 2 x quiet": {
                "ok": ratio <= 2.0, "detail": f"{busy['p99_ms']:.0f} vs {quiet['p99_ms']:.0f} ms ({ratio:.1f}x), "
                                              f"{big_rate:.1f} large bodies/s"}}}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend.large_body_bench")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--senders", type=int, default=3)
    p.add_argument("--send", type=int, help=argparse.SUPPRESS)  # internal: be the sender process
    p.add_argument("--out")
    args = p.parse_args()
    if args.send:
        asyncio.run(send_big(args.send, args.seconds, args.senders))
    else:
        emit(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
