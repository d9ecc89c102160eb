"""What the benches share: a router process started on a config, and a client that speaks ext_proc
to it the way Envoy does (a headers message, then the buffered body, one stream per request)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

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


