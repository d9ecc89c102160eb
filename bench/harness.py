"""What the benches share: starting a router (and an Envoy in front of it whose routes answer
directly), a client that speaks ext_proc as Envoy does (a headers message, then the buffered body,
one stream per request), wrk runs, closed and open loops, CPU read from /proc, and the neighbours
and CPU quotas performance is measured beside. Each bench is a script over these."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from batching import Overloaded
from bench.report import latency_stats
from devstack.envoy_binary import find_envoy
from devstack.readiness import http_ok, wait_ready
from devstack.stack import ROOT, StackPorts, free_port, on_stack_ports
from esr_app.envoy_config import render
from esr_config import load_config

CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
GOOD = ("matched", "default")
_TICK = os.sysconf("SC_CLK_TCK")
NEIGHBOURS = {"pinned": [0], "unpinned1": [None], "unpinned2": [None, None]}
_PROMPT_LINE = "  local p = string.format(prompts[(counter % #prompts) + 1], counter)"
ROUTED = ("matched", "default", "low_confidence")
PINNED_SCRIPT = r"""
local body = '{"model":"code-model","messages":[{"role":"user","content":"write a python function that sorts a list"}]}'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) reasons = {} end
function request() return wrk.format("POST", "/v1/chat/completions", {["content-type"] = "application/json"}, body) end
"""
# Unique prompts (a per-thread counter), a mix that matches routes and that does not; each answer
# is tallied by the reason header and printed as one JSON line at the end.
WRK_SCRIPT = r"""
local prompts = {"solve the equation %dx + 3 = 7", "write a python function number %d that sorts a list",
                 "tell me something nice about the number %d", "what is %d times 17"}
local counter = 0
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) reasons = {} ; tid = math.random(1, 1000000) end
function request()
  counter = counter + 1
  local p = string.format(prompts[(counter % #prompts) + 1], counter) .. " #" .. tid .. "-" .. counter
  local body = '{"model":"auto","messages":[{"role":"user","content":"' .. p .. '"}]}'
  return wrk.format("POST", "/v1/chat/completions", {["content-type"] = "application/json"}, body)
end
function response(status, headers, body)
  local r = headers["x-semantic-route-reason"] or ("none_" .. status)
  reasons[r] = (reasons[r] or 0) + 1
end
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("reasons")) do total[k] = (total[k] or 0) + v end
  end
  local parts = {}
  for k, v in pairs(total) do table.insert(parts, string.format('"%s": %d', k, v)) end
  io.write("REASONS {" .. table.concat(parts, ", ") .. "}\n")
  io.write(string.format("LATENCY_US p50=%d p99=%d max=%d\n", latency:percentile(50), latency:percentile(99), latency.max))
end
"""

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


def run_wrk(port: int, concurrency: int, seconds: float, script: Path, good: tuple[str, ...] = GOOD) -> dict:
    threads = min(2, concurrency)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(script),
         f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=seconds + 60,
    ).stdout
    reasons = json.loads(re.search(r"^REASONS (\{.*\})$", out, re.M).group(1))
    lat = dict(re.findall(r"(p50|p99|max)=(\d+)", out))
    total = sum(reasons.values())
    routed = sum(reasons.get(r, 0) for r in good)
    return {
        "scenario": f"envoy_c{concurrency}",
        "throughput_rps": round(total / seconds, 1),
        "goodput_rps": round(routed / seconds, 1),
        "p50_ms": int(lat["p50"]) / 1000,
        "p99_ms": int(lat["p99"]) / 1000,
        "max_ms": int(lat["max"]) / 1000,
        "fallback_timeout_share": round(reasons.get("fallback_timeout", 0) / total, 4) if total else None,
        "reasons": reasons,
    }


def stop_stacks(stacks: dict) -> None:
    """Ends each (router process, Envoy, listener) of `stacks`, Envoy first; a part never started is None."""
    for proc, envoy, _ in stacks.values():
        for q in (envoy, proc):
            if q is not None:
                q.terminate()
                q.wait(30)


def cli_seconds(*args: str) -> float:
    """Seconds `semantic-router <args>` took, run as a team runs it (its output discarded)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "esr_app", *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def cascade_figures(config: Path, data: Path) -> dict:
    """What `semantic-router eval --json` of `config` on `data` says of the cascade: the share the
    static tier decides, the accuracy, and the encoder's alone."""
    out = subprocess.run([sys.executable, "-m", "esr_app", "eval", "--config", str(config), "--data", str(data), "--json"],
                         check=True, cwd=ROOT, capture_output=True, text=True).stdout
    measured = json.loads(out)
    return {"static_share": ((measured.get("tiers") or {}).get("static") or {}).get("share"),
            "accuracy": measured["accuracy"], "encoder_alone_accuracy": measured.get("encoder_alone_accuracy")}


def wrk_workdir(name: str) -> Path:
    """A fresh work directory for the `name` benchmark, which drives Envoy with wrk; exits where
    wrk is missing."""
    if not shutil.which("wrk"):
        raise SystemExit(f"the {name} benchmark needs wrk: apt-get install wrk")
    return Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("semantic_router_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def start_direct_envoy(config_file: Path, router_port: int, listener: int, admin: int,
                       router_config: Path = ROOT / "router.yaml", args: tuple[str, ...] = ()) -> subprocess.Popen:
    """Envoy on `direct_response_bootstrap`, written to `config_file`; returns once it is ready."""
    config_file.write_text(yaml.safe_dump(direct_response_bootstrap(router_port, listener, admin, router_config)))
    envoy = subprocess.Popen([find_envoy(), "-c", str(config_file), "--log-level", "error", "--disable-hot-restart",
                              *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(envoy, "envoy", lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), 20.0,
               lambda: "(its output is discarded)", poll_s=0.1)
    return envoy


def direct_response_bootstrap(router_port: int, listener: int, admin: int, router_config: Path = ROOT / "router.yaml") -> dict:
    """The rendered gateway for `router_config`, each route answering 200 itself."""
    ports = StackPorts.free(router_config)
    ports.router_grpc, ports.listener, ports.admin = router_port, listener, admin
    boot = render(on_stack_ports(load_config(router_config), ports))
    vhost = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]
    for route in vhost["routes"]:
        if "route" not in route:  # the gateway's own answers (404 for paths that are no LLM API)
            continue
        cluster = route.pop("route")["cluster"]
        route["direct_response"] = {"status": 200, "body": {"inline_string": cluster}}
    return boot


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system, all threads) of `root` and every process below it."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / _TICK
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += [p for p, pp in parent.items() if pp == pid]
    return total


def median_row(trials: list[dict]) -> dict:
    """The trial with the median throughput, plus every trial's throughput for the record."""
    ordered = sorted(trials, key=lambda r: r["throughput_rps"])
    return {**ordered[len(ordered) // 2], "trials_rps": [r["throughput_rps"] for r in trials]}


async def open_loop(submit, texts: list[str], rate: float, duration: float, seed: int = 7) -> dict:
    """Poisson arrivals at `rate` req/s for `duration` s, whatever the server's speed."""
    rng = random.Random(seed)
    latencies: list[float] = []
    failed = Failures()

    async def one(text):
        t0 = time.perf_counter()
        try:
            await submit(text)
            latencies.append(time.perf_counter() - t0)
        except Exception as exc:
            failed.count(exc)

    tasks = []
    start = time.perf_counter()
    at = 0.0
    i = 0
    while at < duration:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(texts[i % len(texts)])))
        i += 1
        at += rng.expovariate(rate)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    return {"throughput_rps": round(len(latencies) / elapsed, 1), **latency_stats(latencies), **failed.row(),
            "offered_rps": round(rate, 1)}


async def closed_loop(submit, texts: list[str], concurrency: int, total: int) -> dict:
    """`concurrency` clients, each sending its next request as soon as the last is answered."""
    next_index = 0
    latencies: list[float] = []
    failed = Failures()

    async def client():
        nonlocal next_index
        while next_index < total:
            text = texts[next_index % len(texts)]
            next_index += 1
            t0 = time.perf_counter()
            try:
                await submit(text)
                latencies.append(time.perf_counter() - t0)
            except Exception as exc:  # counted, not fatal: the report shows them
                failed.count(exc)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return {"throughput_rps": round(len(latencies) / elapsed, 1), **latency_stats(latencies), **failed.row()}


class Failures:
    """Requests that got no embedding: `refused`, the batcher's own answer to more than it holds
    (Overloaded: its queue full, or a predicted miss), which an open loop offered near a ceiling
    measured at a quieter moment meets on a shared machine; `errors`, anything else."""

    def __init__(self) -> None:
        self.refused = self.errors = 0

    def count(self, exc: Exception) -> None:
        if isinstance(exc, Overloaded):
            self.refused += 1
        else:
            self.errors += 1

    def row(self) -> dict:
        return {"errors": self.errors, "refused": self.refused}


@contextlib.contextmanager
def cpu_quota(cpus: float):
    """A child cgroup (v1 `cpu`) holding `cpus` CPUs' worth of CFS quota; removed on exit."""
    if not (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        raise SystemExit(f"the quota scenario needs the cgroup v1 cpu controller at {CGROUP_V1_CPU}")
    group = CGROUP_V1_CPU / f"semantic-router-bench-{os.getpid()}"
    group.mkdir(exist_ok=True)
    period = 100_000
    (group / "cpu.cfs_period_us").write_text(str(period))
    (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
    try:
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (CGROUP_V1_CPU / "cgroup.procs").write_text(pid)
        group.rmdir()


@contextlib.contextmanager
def neighbour(kind: str = "pinned"):
    """Python busy loops (what a CPU-bound sidecar or batch job does), each pinned to its core or
    left to the scheduler (None)."""
    procs = [subprocess.Popen([sys.executable, "-c", ("" if core is None else f"import os; os.sched_setaffinity(0, {{{core}}})\n")
                               + "while True: pass"]) for core in NEIGHBOURS[kind]]
    try:
        time.sleep(0.3)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


class Gateway:
    """One router (pool or single process) and its Envoy."""

    def __init__(self, name: str, workdir: Path, workers: int, socket: str | None):
        self.name, self.workers = name, workers
        config = yaml.safe_load((ROOT / "router.yaml").read_text())
        config["cache_size"] = 0
        config["static_tier"] = {"enabled": False}  # the full path is the embedding path: every prompt reaches the model
        config["server"]["workers"] = workers  # Envoy's config is rendered for a pool of this size
        if socket is not None:
            config["encoder"]["socket"] = socket
        cfg = workdir / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump(config))
        self.grpc, self.metrics, self.listener, admin = free_port(), free_port(), free_port(), free_port()
        self.router = subprocess.Popen(
            [sys.executable, "-m", "esr_app", "serve", "--config", str(cfg), "--grpc-port", str(self.grpc),
             "--metrics-port", str(self.metrics), "--workers", str(workers), "--log-level", "warning"],
            stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for line in self.router.stdout:
            if line.startswith("router ready"):
                break
        else:
            raise RuntimeError(f"router {name} did not start")
        self.envoy = start_direct_envoy(workdir / f"{name}-envoy.yaml", self.grpc, self.listener, admin, cfg,
                                        ("--concurrency", "2"))

    def measure(self, path: str, script: Path, seconds: float) -> dict:
        before = scrape(self.metrics)
        cpu0, envoy0 = tree_cpu(self.router.pid), tree_cpu(self.envoy.pid)
        row = run_wrk(self.listener, 64, seconds, script)
        cpu1, envoy1 = tree_cpu(self.router.pid), tree_cpu(self.envoy.pid)
        after = scrape(self.metrics)
        answered = sum(row["reasons"].values())
        streams = {k.split('"')[1]: int(after[k] - before.get(k, 0)) for k in after
                   if k.startswith("semantic_router_ext_proc_streams_total{")}
        batches = after.get("semantic_router_batch_size_count", 0) - before.get("semantic_router_batch_size_count", 0)
        items = after.get("semantic_router_batch_size_sum", 0) - before.get("semantic_router_batch_size_sum", 0)
        return {
            "workload": path, "scenario": self.name, "workers": self.workers,
            "throughput_rps": row["throughput_rps"], "goodput_rps": row["goodput_rps"],
            "p50_ms": row["p50_ms"], "p99_ms": row["p99_ms"],
            "router_cpu_ms_per_request": round(1000 * (cpu1 - cpu0) / max(1, answered), 3),
            "envoy_cpu_ms_per_request": round(1000 * (envoy1 - envoy0) / max(1, answered), 3),
            "mean_batch": round(items / batches, 1) if batches else None,
            "streams_by_process": streams, "reasons": row["reasons"],
        }

    def close(self) -> None:
        for proc in (self.envoy, self.router):
            proc.terminate()
        for proc in (self.envoy, self.router):
            proc.wait(60)


def split_tallies(row: dict, seconds: float) -> tuple[dict[str, int], int, int]:
    """run_wrk's `row` on wrk_script: the tier tallies taken out of its reasons, and its throughput
    set from the answers alone (run_wrk counted the tallies as answers too) -> (tiers, guessed, answers)."""
    tiers = {k: row["reasons"].pop(k) for k in list(row["reasons"]) if k.startswith("tier_")}
    guessed = row["reasons"].pop("guessed", 0)
    answers = sum(row["reasons"].values())
    row["throughput_rps"] = round(answers / seconds, 1)
    return tiers, guessed, answers


def wrk_script(texts: list[str]) -> str:
    """WRK_SCRIPT on `texts`: each request one of them as written (a suffix would be routed on too,
    and no held-out prompt carries one), the body unique across threads and runs by its `user`
    member; answers tallied by reason and by tier. Both caches are off, so a text met again costs
    what it cost the first time. The texts go in a fixed shuffled order, each wrk thread from its
    own random place in it: a run sends a few thousand of them, and a data file in label order
    (CLINC150's is by intent) would otherwise be sampled by its first intents only."""
    texts = list(texts)
    random.Random(0).shuffle(texts)
    # JSON-escaped (they go into the body as they are), in Lua long brackets (no Lua escapes).
    table = "local prompts = {" + ", ".join(f"[==[{json.dumps(t)[1:-1]}]==]" for t in texts) + "}\n"
    script = WRK_SCRIPT.split("local counter", 1)[1].replace(
        "tid = math.random(1, 1000000) end", "tid = math.random(1, 1000000) ; counter = math.random(0, #prompts - 1) end")
    assert "counter = math.random" in script
    script = table + "local counter" + script.replace(
        _PROMPT_LINE, "  local p = prompts[(counter % #prompts) + 1]").replace(
        ' .. " #" .. tid .. "-" .. counter', "").replace(
        """'{"model":"auto","messages":""", """'{"model":"auto","user":"' .. tid .. '-' .. counter .. '","messages":""")
    # Tiers tallied as reasons of their own: "tier_static", "tier_encoder"; "guessed": a fallback the
    # static tier's guess routed (also counted under tier_static).
    return script.replace('  reasons[r] = (reasons[r] or 0) + 1',
                          '  reasons[r] = (reasons[r] or 0) + 1\n'
                          '  local t = headers["x-semantic-route-tier"]\n'
                          '  if t then reasons["tier_" .. t] = (reasons["tier_" .. t] or 0) + 1 end\n'
                          '  if t == "static" and r:sub(1, 9) == "fallback_" then '
                          'reasons["guessed"] = (reasons["guessed"] or 0) + 1 end')


