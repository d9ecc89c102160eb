"""Latency statistics and the JSON + readable-table output every benchmark prints."""

from __future__ import annotations

import json
import sys
from typing import Sequence

import numpy as np


def latency_stats(latencies_s: Sequence[float]) -> dict[str, float]:
    if not latencies_s:
        return {"p50_ms": float("nan"), "p95_ms": float("nan"), "p99_ms": float("nan")}
    a = np.asarray(latencies_s) * 1000.0
    return {f"p{q}_ms": round(float(np.percentile(a, q)), 2) for q in (50, 95, 99)}


COLUMNS = ("workload", "scenario", "throughput_rps", "p50_ms", "p95_ms", "p99_ms", "mean_batch", "padding", "errors")


def print_table(rows: list[dict], file=sys.stdout, columns: Sequence[str] = COLUMNS) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns), file=file)
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns), file=file)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def emit(result: dict, out_path: str | None, columns: Sequence[str] = COLUMNS) -> None:
    """Readable table first, then the whole result as one JSON document."""
    print_table(result["rows"], columns=columns)
    if result.get("checks"):
        print()
        for name, check in result["checks"].items():
            print(f"{'PASS' if check['ok'] else 'FAIL'}  {name}: {check['detail']}")
    text = json.dumps(result, indent=2)
    print(text)
    if out_path:
        with open(out_path, "w") as f:
            f.write(text)
