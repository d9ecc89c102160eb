"""The router's front end through the real Envoy: CPU per request and how it scales with workers.

    python -m bench.frontend_bench [--workers 1 2 4] [--seconds 8] [--trials 2] [--out result.json]

Each worker count gets its own router (a pool on encoder.socket, fed by one stub model process of
fixed cost, bench/stub_model.py) behind its own Envoy whose routes answer directly; `inprocess`
is the one-process router with the real model loaded (today's default). Two paths, by wrk at
c64: `pinned` (the body names a backend model: no embedding) and `full` (model "auto", unique
prompts: embedded through the batcher). Trials interleave every router and path.

CPU per request is read from /proc (user + system of the router's whole process tree and of
Envoy) over each run, divided by the requests answered: steadier than throughput on a shared
machine, where wrk, Envoy and the router share the same cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

from bench.overload_bench import run_wrk, scrape, start_direct_envoy, wrk_workdir
from bench.report import emit
from devstack.stack import ROOT, free_port

PINNED_SCRIPT = r"""
local body = '{"model":"code-model","messages":[{"role":"user","content":"write a python function that sorts a list"}]}'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) reasons = {} end
function request() return wrk.format("POST", "/v1/chat/completions", {["content-type"] = "application/json"}, body) end
"""

_TICK = os.sysconf("SC_CLK_TCK")


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


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend_bench")
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--no-inprocess", action="store_true", help="skip the one-process router with the real model")
    p.add_argument("--batch-ms", type=float, default=2.0, help="the stub model's fixed cost per batch")
    p.add_argument("--out")
    args = p.parse_args()
    workdir = wrk_workdir("frontend")
    scripts = {"pinned": workdir / "pinned.lua", "full": workdir / "full.lua"}
    from bench.overload_bench import WRK_SCRIPT

    scripts["pinned"].write_text(PINNED_SCRIPT + WRK_SCRIPT[WRK_SCRIPT.index("function response"):])
    scripts["full"].write_text(WRK_SCRIPT)
    sock = str(workdir / "model.sock")
    model = subprocess.Popen([sys.executable, "-m", "bench.stub_model", "--socket", sock, "--batch-ms", str(args.batch_ms)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    for line in model.stdout:
        if line.startswith("model ready"):
            break
    gateways: list[Gateway] = []
    rows: list[dict] = []
    try:
        if not args.no_inprocess:
            gateways.append(Gateway("inprocess", workdir, 1, None))
        for n in args.workers:
            gateways.append(Gateway(f"pool_w{n}", workdir, n, sock))
        for g in gateways:  # warm-up
            run_wrk(g.listener, 16, 2, scripts["pinned"])
        for _ in range(args.trials):
            for g in gateways:
                for path in ("pinned", "full"):
                    if g.name == "inprocess" and path == "full":
                        continue  # the real model on this CPU, not the front end, would be measured
                    rows.append(g.measure(path, scripts[path], args.seconds))
    finally:
        for g in gateways:
            g.close()
        model.terminate()
        model.wait(30)
    emit({"benchmark": "frontend", "cpu_count": os.cpu_count(), "stub_batch_ms": args.batch_ms, "rows": rows,
          "summary": summarize(rows)}, args.out)


def summarize(rows: list[dict]) -> list[str]:
    """Best-of-trials CPU per request, and throughput scaling from the fewest workers."""
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["workload"], r["scenario"])
        if key not in best or r["router_cpu_ms_per_request"] < best[key]["router_cpu_ms_per_request"]:
            best[key] = r
    lines = [f"{w:<7} {s:<10} router {r['router_cpu_ms_per_request']:.3f} ms CPU/req, envoy "
             f"{r['envoy_cpu_ms_per_request']:.3f}, {r['throughput_rps']:.0f} req/s, p99 {r['p99_ms']:.1f} ms"
             for (w, s), r in sorted(best.items())]
    for line in lines:
        print(line)
    return lines


if __name__ == "__main__":
    main()
