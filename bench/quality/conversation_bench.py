"""Conversation routing as a gateway sees it: SGD dialogues replayed request by request (each request
carries the conversation so far, as chat clients send it), for quality through Envoy and for the
cost of the track policy against routing on the last turn alone.

    make sgd && python -m bench.quality.conversation_bench [--config build/sgd.fitted.yaml] [--seconds 15] [--trials 3]
        [--conditions alone neighbour quota] [--without-cache]

1. Quality: every dev dialogue through a real Envoy and router on `--config`; per user turn, the
   route in x-semantic-route against the label (all turns, short follow-ups, topic changes).
2. Cost: two routers on the same config, conversation.policy track and last_turns, each fed fresh
   train dialogues (nothing of them in its cache yet) at `--concurrency` conversations at once,
   trials interleaved; routed req/s and the ratio, with the embedding cache's hit share.

Data: ../shared/data/sgd (Rastogi et al., AAAI 2020, CC BY-SA 4.0), read in place, never copied.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.harness import cpu_quota, neighbour
from bench.harness import ExtProcClient, launch_router
from bench.harness import scrape
from bench.report import emit, latency_stats
from devstack.stack import ROOT, Stack, StackPorts, free_port
from esr_config import load_config
from esr_tuning.conversations import Dialogue, TurnTable, conversation_metrics

SGD = ROOT.parent / "shared" / "data" / "sgd"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def requests_of(dialogue: dict) -> list[dict]:
    """The request body a client sends at each user turn: the conversation up to that turn."""
    out, messages = [], []
    for m in dialogue["messages"]:
        messages.append(m)
        if m["role"] == "user":
            out.append({"model": "auto", "messages": list(messages)})
    return out


async def replay(send, dialogues: list[dict], concurrency: int) -> tuple[dict, list[float], float]:
    """Dialogues `concurrency` at a time, each one's requests in order. Returns the route of every
    (dialogue, turn), request latencies, and the wall time."""
    routes: dict[tuple[int, int], str] = {}
    latencies: list[float] = []
    todo = iter(enumerate(dialogues))

    async def worker() -> None:
        for d, dialogue in todo:
            for t, body in enumerate(requests_of(dialogue)):
                start = time.perf_counter()
                routes[(d, t)] = await send(json.dumps(body).encode())
                latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return routes, latencies, time.perf_counter() - start


def quality(routes: dict, dialogues: list[dict]) -> dict:
    table = TurnTable.of([Dialogue([m["content"] for m in d["messages"] if m["role"] == "user"], d["labels"])
                          for d in dialogues])
    predicted = [routes[(d, t)] for d, dialogue in enumerate(dialogues) for t in range(len(dialogue["labels"]))]
    return conversation_metrics(table, predicted)


async def through_envoy(config_path: Path, dialogues: list[dict], concurrency: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-conversation-"))
    stack = Stack(workdir, StackPorts.free(config_path), router_config=config_path).start()
    try:
        async with httpx.AsyncClient(base_url=stack.url, timeout=30,
                                     limits=httpx.Limits(max_connections=concurrency)) as client:
            async def send(body: bytes) -> str:
                r = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
                return r.headers["x-semantic-route"]

            routes, latencies, wall = await replay(send, dialogues, concurrency)
    finally:
        stack.stop()
    return {"scenario": "envoy_track", "requests": len(latencies), "throughput_rps": round(len(latencies) / wall, 1),
            **latency_stats(latencies), **quality(routes, dialogues)}


class Router:
    """A router process on `config` with one conversation policy (and cache size), spoken to over
    ext_proc directly."""

    def __init__(self, workdir: Path, config: dict, policy: str, cache_size: int | None = None,
                 cgroup: Path | None = None):
        self.name = policy if cache_size is None else f"{policy}_cache{cache_size}"
        config = {**config, "conversation": {**config.get("conversation", {}), "policy": policy}}
        config["server"] = {**config.get("server", {}), "deadline_ms": 30000}  # latency, not fallbacks
        if cache_size is not None:
            config["cache_size"] = cache_size
        self.metrics_port = free_port()
        self.proc, port = launch_router(workdir / f"{self.name}.yaml", config, cgroup, self.metrics_port)
        self.client = ExtProcClient(port)

    async def send(self, body: bytes) -> str:
        return (await self.client.send(body))["x-semantic-route"]

    async def close(self) -> None:
        await self.client.channel.close()
        self.proc.terminate()
        self.proc.wait(30)


def chunks(dialogues: list[dict], size: int):
    for i in range(0, len(dialogues) - size + 1, size):
        yield dialogues[i : i + size]


async def cost(config_path: Path, train: list[dict], args, condition: str) -> list[dict]:
    """Trials under `condition`: alone, beside a CPU-bound neighbour on one core, or in a 1-CPU quota."""
    with cpu_quota(1.0) if condition == "quota" else contextlib.nullcontext() as group:
        with neighbour() if condition == "neighbour" else contextlib.nullcontext():
            return await _cost(config_path, train, args, condition, group)


async def _cost(config_path: Path, train: list[dict], args, condition: str, group: Path | None) -> list[dict]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-conversation-"))
    config = yaml.safe_load(config_path.read_text())
    for key in ("head_path",):  # the copy lives elsewhere: keep its head where it was
        if config.get("classifier", {}).get(key):
            config["classifier"][key] = str((config_path.parent / config["classifier"][key]).resolve())
    routers = [Router(workdir, config, "last_turns", cgroup=group), Router(workdir, config, "track", cgroup=group)]
    if args.without_cache:  # what the cache saves: every earlier turn embedded again on every request
        routers.append(Router(workdir, config, "track", cache_size=0, cgroup=group))
    fresh = chunks(train, args.chunk)
    rows = []
    try:
        for r in routers:  # first batches and the batch-cost model, on dialogues not used again
            await replay(r.send, next(fresh), args.concurrency)
        for trial in range(args.trials):
            for r in routers:
                before = scrape(r.metrics_port)
                done, latencies, wall = 0, [], 0.0
                while wall < args.seconds:  # fresh dialogues until the trial has run long enough
                    _, lat, w = await replay(r.send, next(fresh), args.concurrency)
                    done, wall = done + len(lat), wall + w
                    latencies += lat
                after = scrape(r.metrics_port)
                delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                hits = sum(v for k, v in delta.items() if k.startswith("semantic_router_embedding_cache_total")
                           and ('result="hit"' in k or 'result="shared"' in k))
                lookups = sum(v for k, v in delta.items() if k.startswith("semantic_router_embedding_cache_total"))
                embedded = delta.get("semantic_router_batch_size_sum", 0)
                rows.append({"workload": condition, "scenario": f"{r.name}_c{args.concurrency}", "trial": trial,
                             "requests": done, "throughput_rps": round(done / wall, 1), **latency_stats(latencies),
                             "embedded_per_request": round(embedded / done, 3) if done else None,
                             "cache_hit_share": round(hits / lookups, 3) if lookups else None})
    finally:
        for r in routers:
            await r.close()
    return rows


def summarize(quality_row: dict | None, rows: list[dict], args) -> dict:
    out_rows = ([quality_row] if quality_row else []) + rows
    checks = {}
    if quality_row:
        checks["quality_through_envoy"] = {
            "ok": quality_row["all_turns"] >= 0.90 and quality_row["short_followups"] >= 0.85
            and quality_row["topic_changes"] >= 0.90,
            "detail": f"all {quality_row['all_turns']} (>= 0.90), short follow-ups {quality_row['short_followups']} "
                      f"(>= 0.85), topic changes {quality_row['topic_changes']} (>= 0.90)"}
    for condition in args.conditions:
        by = {p: [r["throughput_rps"] for r in rows if r["scenario"] == f"{p}_c{args.concurrency}"
                  and r["workload"] == condition] for p in ("track", "last_turns")}
        # Trial by trial (interleaved, so they saw the same machine), then the median ratio.
        ratios = sorted(t / b for t, b in zip(by["track"], by["last_turns"]))
        if ratios:
            ratio = ratios[len(ratios) // 2]
            checks[f"track_cost_{condition}"] = {
                "ok": ratio >= 0.8, "detail": f"track / last_turns routed req/s = {ratio:.2f} "
                f"(trials: {', '.join(f'{x:.2f}' for x in ratios)}; target >= 0.8)"}
    return {"bench": "conversation", "config": str(args.config), "concurrency": args.concurrency, "rows": out_rows,
            "checks": checks}


async def run(args) -> dict:
    dev, train = load(args.dev), load(args.train)
    quality_row = None if args.skip_quality else await through_envoy(args.config, dev, args.concurrency)
    rows = []
    for i, condition in enumerate([] if args.skip_cost else args.conditions):
        # Each condition on dialogues of its own: a router's cache must not know them already.
        cut = i * len(train) // len(args.conditions)
        rows += await cost(args.config, train[cut:] + train[:cut], args, condition)
    return summarize(quality_row, rows, args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "build" / "sgd.fitted.yaml")
    p.add_argument("--dev", type=Path, default=SGD / "dev.jsonl")
    p.add_argument("--train", type=Path, default=SGD / "train.jsonl")
    p.add_argument("--concurrency", type=int, default=32, help="conversations in flight at once")
    p.add_argument("--seconds", type=float, default=15.0, help="per trial and policy")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--chunk", type=int, default=64, help="dialogues per replay round")
    p.add_argument("--without-cache", action="store_true", help="also track with cache_size 0")
    p.add_argument("--conditions", nargs="+", choices=("alone", "neighbour", "quota"), default=["alone"],
                   help="neighbour: a CPU-bound process on one core; quota: the routers in a 1-CPU CFS quota")
    p.add_argument("--skip-quality", action="store_true")
    p.add_argument("--skip-cost", action="store_true")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args()
    if not args.config.exists():
        raise SystemExit(f"{args.config} is missing: run `make sgd` first")
    load_config(args.config)  # a bad config fails here, with its key, not in a router's log
    emit(asyncio.run(run(args)), args.out)


if __name__ == "__main__":
    main()
