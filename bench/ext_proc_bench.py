"""The same load through the full ext_proc path: a real router process, gRPC streams opened the way
Envoy opens them (headers message, then the buffered body), the filter chain, the batcher.

    python -m bench.ext_proc_bench [--scale 1.0] [--out result.json]

The load generator is Python on the same machine, so on 2 cores it competes with the router:
read the figures as a lower bound on what the router holds behind Envoy.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from bench.batcher_bench import closed_loop, open_loop
from bench.report import emit
from bench.workloads import WORKLOADS
from devstack.stack import ROOT, free_port

HEADERS = pb.ProcessingRequest(
    request_headers=pb.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[
                base_pb2.HeaderValue(key=k, raw_value=v.encode())
                for k, v in ((":method", "POST"), (":path", "/v1/chat/completions"), (":authority", "gateway"),
                             ("content-type", "application/json"), ("user-agent", "bench"), ("x-request-id", "r"))
            ]
        )
    )
)


class ExtProcClient:
    def __init__(self, port: int):
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.ExternalProcessorStub(self.channel)
        self.reasons: collections.Counter[str] = collections.Counter()

    async def route(self, prompt: str, model: str = "auto") -> None:
        await self.send(json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}]}).encode())

    async def send(self, body: bytes) -> dict[str, str]:
        """One request's headers and body through the stream; the headers the router set."""
        call = self.stub.Process()
        await call.write(HEADERS)
        await call.read()
        await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
        resp = await call.read()
        await call.done_writing()
        headers = {h.header.key: h.header.raw_value.decode() for h in resp.request_body.response.header_mutation.set_headers}
        if "x-semantic-route-reason" in headers:
            self.reasons[headers["x-semantic-route-reason"]] += 1
        return headers


def start_router(
    workdir: Path, device: str, cpu_threads: int | None, deadline_ms: float = 30000, cgroup: Path | None = None,
    metrics_port: int | None = None, encoder: dict | None = None, server: dict | None = None,
    cascade: bool = False,
) -> tuple[subprocess.Popen, int]:
    """A router process on the default routes with the cache off and, unless `cascade`, the static
    tier off (every request reaches the model); `cgroup`: a cgroup v1 directory the process joins
    before it starts (a CPU quota)."""
    config = yaml.safe_load((ROOT / "router.yaml").read_text())
    config["cache_size"] = 0
    if not cascade:
        config["static_tier"] = {"enabled": False}
    config["server"]["deadline_ms"] = deadline_ms  # the default 30 s measures latency, not fallbacks
    config["encoder"]["device"] = device
    if cpu_threads:
        config["encoder"]["cpu_threads"] = cpu_threads
    config["encoder"].update(encoder or {})
    config["server"].update(server or {})
    return launch_router(workdir / "router.yaml", config, cgroup, metrics_port)


def launch_router(path: Path, config: dict, cgroup: Path | None = None, metrics_port: int | None = None
                  ) -> tuple[subprocess.Popen, int]:
    """`config` written to `path` and served by a router process (on a free gRPC port, returned),
    once it says it is ready; `cgroup`: a cgroup v1 directory it joins before it starts."""
    path.write_text(yaml.safe_dump(config))
    port = free_port()

    def join_cgroup() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.Popen(
        [sys.executable, "-m", "esr_app", "serve", "--config", str(path), "--grpc-port", str(port),
         "--metrics-port", str(metrics_port or free_port()), "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
        preexec_fn=join_cgroup if cgroup is not None else None,
    )
    for line in proc.stdout:
        if line.startswith("router ready"):
            return proc, port
    raise RuntimeError(f"router on {path} did not start")


async def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-ext-proc-"))
    proc, port = start_router(workdir, args.device, args.cpu_threads)
    rows = []
    try:
        client = ExtProcClient(port)
        n_warm = WORKLOADS["short"](64, seed=99)
        await closed_loop(client.route, n_warm, 16, 64)
        pinned = WORKLOADS["short"](512, seed=98)
        res = await closed_loop(lambda t: client.route(t, model="code-model"), pinned, 64, int(2000 * args.scale))
        rows.append({"workload": "pinned", "scenario": "ext_proc_c64_no_model", **res})
        for name in args.workloads:
            n = max(64, int((2048 if name == "short" else 512) * args.scale))
            texts = WORKLOADS[name](n, seed=11)
            peak = 0.0
            for c in (1, 8, 64, 256):
                total = min(n, max(64, 16 * c)) if c == 1 else n
                client.reasons.clear()
                res = await closed_loop(client.route, texts, c, total)
                rows.append({"workload": name, "scenario": f"ext_proc_c{c}", **res, "reasons": dict(client.reasons)})
                peak = max(peak, res["throughput_rps"])
            # Load as a share of what this path itself holds (the model's ceiling is out of reach
            # here: the Python client shares the cores), plus an optional fixed rate.
            rates = [(f"ext_proc_poisson_{int(f * 100)}pct", f * peak) for f in (0.5, 0.8, 0.95)]
            if args.rate.get(name):
                rates.append(("ext_proc_poisson", args.rate[name]))
            for scenario, rate in rates:
                client.reasons.clear()
                res = await open_loop(client.route, texts, rate, max(3.0, 6.0 * args.scale))
                rows.append({"workload": name, "scenario": scenario, **res, "reasons": dict(client.reasons)})
        await client.channel.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return {"benchmark": "ext_proc", "cpu_count": os.cpu_count(), "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ext_proc_bench")
    p.add_argument("--device", default="auto")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--cpu-threads", type=int, help="override encoder.cpu_threads")
    p.add_argument("--workloads", nargs="+", default=["short", "mixed"], choices=sorted(WORKLOADS))
    p.add_argument("--poisson-short", type=float, default=0.0, help="offered req/s for an open-loop run (0: skip)")
    p.add_argument("--poisson-mixed", type=float, default=0.0)
    p.add_argument("--out")
    args = p.parse_args()
    args.rate = {"short": args.poisson_short, "mixed": args.poisson_mixed}
    emit(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
