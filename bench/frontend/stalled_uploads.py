"""Envoy's memory while clients leave uploads half-sent: N connections each stop at 7.5 MiB of an
8 MB body, through a stack whose Envoy config is rendered from router.yaml.

    python -m bench.frontend.stalled_uploads [--connections 40 80] [--request-timeout 6] [--out result.json]

Reports Envoy's peak RSS (the number a pod's memory limit kills on), its RSS once every upload
was answered, and how each was answered (408: request timeout; 503: overload manager).
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
import time
from pathlib import Path

from bench.report import emit
from devstack.stack import stack_with

POD_LIMIT_MB = 512  # the Envoy container's limit in deploy/kubernetes/base/deployment.yaml


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))


def stall_many(stack, n: int, wait_s: float) -> dict:
    conns: list[socket.socket] = []
    lock = threading.Lock()

    def stall():
        c = socket.create_connection(("127.0.0.1", stack.ports.listener), timeout=30)
        try:
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\ncontent-type: application/json\r\n"
                      b"content-length: 8000000\r\n\r\n" + b"x" * (7 * 1024 * 1024 + 512 * 1024))
        except OSError:
            pass
        with lock:
            conns.append(c)

    threads = [threading.Thread(target=stall) for _ in range(n)]
    for t in threads:
        t.start()
    peak, answers = 0, {}
    give_up = time.monotonic() + wait_s
    while len(answers) < n and time.monotonic() < give_up:
        peak = max(peak, rss_mb(stack.envoy.pid))
        with lock:
            pending = [c for c in conns if c.fileno() not in answers]
        for c in pending:
            c.settimeout(0.05)
            try:
                answers[c.fileno()] = c.recv(12).decode(errors="replace")
            except TimeoutError:
                pass
            except OSError as exc:
                answers[c.fileno()] = type(exc).__name__
        time.sleep(0.1)
    for t in threads:
        t.join()
    after = rss_mb(stack.envoy.pid)
    for c in conns:
        c.close()
    counts: dict[str, int] = {}
    for a in answers.values():
        counts[a] = counts.get(a, 0) + 1
    return {"scenario": f"stalled_{n}", "peak_rss_mb": peak, "rss_after_mb": after, "answers": counts,
            "unanswered": n - len(answers)}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend.stalled_uploads")
    p.add_argument("--connections", nargs="+", type=int, default=[40, 80])
    p.add_argument("--request-timeout", type=float, default=6.0, help="envoy.request_timeout_s (shipped: 60)")
    p.add_argument("--out")
    args = p.parse_args()
    rows = []
    for n in args.connections:  # a fresh stack each: RSS does not carry over
        def shorten(config):
            config["envoy"]["request_timeout_s"] = args.request_timeout

        with stack_with(Path(tempfile.mkdtemp(prefix="bench-stalled-")), shorten) as stack:
            rows.append(stall_many(stack, n, args.request_timeout + 30))
    checks = {f"{r['scenario']}: Envoy's peak RSS under the {POD_LIMIT_MB} MB pod limit": {
        "ok": r["peak_rss_mb"] < POD_LIMIT_MB, "detail": f"{r['peak_rss_mb']} MB, answers {r['answers']}"}
        for r in rows}
    emit({"benchmark": "stalled_uploads", "rows": rows, "checks": checks}, args.out)


if __name__ == "__main__":
    main()
