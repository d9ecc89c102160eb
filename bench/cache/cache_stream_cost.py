"""What the response cache costs a streamed answer: ext_proc messages and c16 throughput.

    python -m bench.cache.cache_stream_cost [--chunks 500] [--seconds 8] [--trials 3] [--out build/bench-cache-stream.json]

Two stacks (router.yaml, mock backends streaming `--chunks` events an answer, Envoy), one with
`cache.enabled`. Each request is a new prompt with `stream: true` (every one a miss, its answer
kept as it passes). Counted from Envoy's own ext_proc stats: the messages Envoy sent the router
per request and the router's CPU per request (sequential); then req/s at --concurrency, cache on vs off, trials interleaved.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from bench.closed_loop import closed_loop_rps
from bench.report import emit
from devstack.stack import stack_with


def _stream(http: httpx.Client, chunks: int) -> bool:
    body = {"model": "auto", "stream": True,
            "messages": [{"role": "user", "content": f"solve the equation 2x + 3 = 11 {uuid.uuid4().hex}"}]}
    with http.stream("POST", "/v1/chat/completions", json=body, headers={"x-mock-chunks": str(chunks)}) as r:
        data = b"".join(r.iter_bytes())
    return r.status_code == 200 and data.endswith(b"data: [DONE]\n\n") and \
        r.headers.get("x-semantic-route-reason") == "matched"


def messages_sent(admin_url: str) -> int:
    text = httpx.get(f"{admin_url}/stats", timeout=5).text
    return sum(int(m) for m in re.findall(r"ext_proc\.[\w.]*stream_msgs_sent: (\d+)", text))


def router_cpu_s(metrics_url: str) -> float:
    time.sleep(1.2)  # the gauge is refreshed each second
    text = httpx.get(metrics_url, timeout=5).text
    return sum(float(v) for v in re.findall(r'semantic_router_process_cpu_seconds\{[^}]*\} ([0-9.e+-]+)', text))


def stores(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=5).text
    return sum(float(v) for v in re.findall(r"semantic_router_cache_stores_total ([0-9.e+-]+)", text))


def rps(url: str, chunks: int, seconds: float, concurrency: int) -> float:
    return closed_loop_rps(url, seconds, concurrency, lambda http: _stream(http, chunks), timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cache.cache_stream_cost")
    p.add_argument("--chunks", type=int, default=500)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=60, help="sequential requests counted for messages and CPU")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    def on(config):
        config["cache"] = {"enabled": True}

    with stack_with(Path(tempfile.mkdtemp(prefix="bench-stream-on-")), on) as cached, \
            stack_with(Path(tempfile.mkdtemp(prefix="bench-stream-off-")), lambda c: None) as plain:
        per_request, cpu_ms, kept = {}, {}, {}
        for name, stack in (("on", cached), ("off", plain)):
            admin = f"http://127.0.0.1:{stack.ports.admin}"
            with httpx.Client(base_url=stack.url, timeout=60) as http:
                for _ in range(20):  # warm-up
                    assert _stream(http, args.chunks)
                before, cpu, stored = messages_sent(admin), router_cpu_s(stack.metrics_url), stores(stack.metrics_url)
                for _ in range(args.requests):
                    assert _stream(http, args.chunks)
                cpu_ms[name] = round(1000 * (router_cpu_s(stack.metrics_url) - cpu) / args.requests, 2)
                kept[name] = int(stores(stack.metrics_url) - stored)
            per_request[name] = (messages_sent(admin) - before) / args.requests
        trials: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(args.trials):
            trials["on"].append(round(rps(cached.url, args.chunks, args.seconds, args.concurrency), 1))
            trials["off"].append(round(rps(plain.url, args.chunks, args.seconds, args.concurrency), 1))
    median = {k: sorted(v)[len(v) // 2] for k, v in trials.items()}
    rows = [{"workload": f"{args.chunks}-chunk streamed misses", "scenario": f"cache {k}",
             "ext_proc_messages_per_request": per_request[k], "router_cpu_ms_per_request": cpu_ms[k], "kept": kept[k],
             "throughput_rps": median[k]} for k in ("on", "off")]
    checks = {"every streamed miss kept (cache on)": {"ok": kept["on"] == args.requests,
                                                      "detail": f"{kept['on']} of {args.requests}"},
              "streamed misses req/s, cache on >= 0.9 x off": {
        "ok": median["on"] >= 0.9 * median["off"],
        "detail": f"{median['on']} vs {median['off']} req/s ({median['on'] / median['off']:.2f}x); trials {trials}"}}
    print(f"router CPU per streamed miss, cache on vs off: {cpu_ms['on']} vs {cpu_ms['off']} ms "
          f"({cpu_ms['on'] / cpu_ms['off']:.2f}x)")
    emit({"chunks": args.chunks, "rows": rows, "checks": checks, "trials": trials}, args.out,
         columns=("workload", "scenario", "ext_proc_messages_per_request", "router_cpu_ms_per_request", "kept",
                  "throughput_rps"))


if __name__ == "__main__":
    main()
