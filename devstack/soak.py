"""Soak load through Envoy: bounded request count, loopback only, mixed concurrency.

    python -m devstack.soak --requests 20000     (make soak: a fresh stack, then this)

Reports answered / status counts, router resident-memory growth, threads and asyncio tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import time

import aiohttp

PROMPTS = [
    "solve {a}x + {b} = {c}", "what is the integral of x^{a} from 0 to {b}", "compute {a} * {b} + {c}",
    "write a python function that returns the {a}th fibonacci number", "why does my java code throw error {a}",
    "how do I sort {a} items in rust", "tell me a story about {a} cats", "what should I cook for {a} guests",
    "recommend {a} books about history",
]


async def soak(url: str, requests: int, phases=(1, 8, 32, 64), seed: int = 3, timeout: float = 30.0) -> dict:
    """Sends `requests` chat requests in phases of rising concurrency; a third repeat earlier prompts."""
    rng = random.Random(seed)
    statuses: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    seen: list[str] = []
    per_phase = requests // len(phases)
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for concurrency in phases:
            remaining = per_phase

            async def worker():
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    if seen and rng.random() < 0.33:
                        prompt = rng.choice(seen)
                    else:
                        prompt = rng.choice(PROMPTS).format(a=rng.randint(1, 999), b=rng.randint(1, 99), c=rng.randint(1, 99))
                        seen.append(prompt)
                    body = {"model": "auto", "messages": [{"role": "user", "content": prompt}]}
                    try:
                        async with session.post(f"{url}/v1/chat/completions", json=body) as r:
                            await r.read()
                            statuses[str(r.status)] += 1
                            reasons[r.headers.get("x-semantic-route-reason", "none")] += 1
                    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                        statuses[type(exc).__name__] += 1

            await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    return {"requests": sum(statuses.values()), "statuses": dict(statuses), "reasons": dict(reasons),
            "seconds": round(elapsed, 1), "rps": round(sum(statuses.values()) / elapsed, 1)}


# gRPC's event engine adds a worker thread (at most one a second) while its pool is busy and
# reclaims one idle for 20 s: growth after a burst is not a leak until that time has passed, and a
# baseline taken while the pool was grown may be undercut later.
GRPC_IDLE_THREAD_LIMIT_S = 20.0
GRPC_ELASTIC_THREAD = "event_engine"


def process_figures(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "threads": int(fields["Threads"])}


def thread_names(pid: int) -> collections.Counter[str]:
    names: collections.Counter[str] = collections.Counter()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                names[f.read().strip()] += 1
        except FileNotFoundError:  # the thread ended while we listed
            pass
    return names


def settled_threads(pid: int, baseline: collections.Counter[str],
                    timeout: float | None = None) -> collections.Counter[str]:
    """The process's threads once none is beyond `baseline`, or as they stand after `timeout`
    (default: gRPC's idle limit for each elastic worker beyond the baseline, since it reclaims
    them one at a time, plus 10 s; the suite saw one left after a single limit's wait)."""
    if timeout is None:
        extra = (thread_names(pid) - baseline).get(GRPC_ELASTIC_THREAD, 0)
        timeout = GRPC_IDLE_THREAD_LIMIT_S * max(1, extra + 1) + 10
    deadline = time.monotonic() + timeout
    while (names := thread_names(pid)) - baseline and time.monotonic() < deadline:
        time.sleep(0.5)
    return names


def fixed_threads(names: collections.Counter[str]) -> dict[str, int]:
    """The threads that must not change while serving: all but gRPC's elastic workers."""
    return {name: n for name, n in names.items() if name != GRPC_ELASTIC_THREAD}


def main() -> None:
    from pathlib import Path
    import tempfile

    from devstack.stack import Stack, StackPorts

    p = argparse.ArgumentParser(prog="python -m devstack.soak")
    p.add_argument("--requests", type=int, default=20000)
    args = p.parse_args()
    ports = StackPorts.free()
    with Stack(Path(tempfile.mkdtemp(prefix="soak-")), ports) as stack:
        asyncio.run(soak(stack.url, 500))  # warm-up: caches, allocator, gRPC connections
        before = process_figures(stack.router.pid)
        threads_before = thread_names(stack.router.pid)
        result = asyncio.run(soak(stack.url, args.requests))
        threads_after = settled_threads(stack.router.pid, threads_before)
        after = process_figures(stack.router.pid)
    result.update(router_before=before, router_after=after,
                  threads_left=dict(threads_after - threads_before),
                  rss_growth_mb=round(after["rss_mb"] - before["rss_mb"], 1))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
