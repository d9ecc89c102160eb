"""How long a router takes from its start to ready (gRPC health SERVING, "router ready" on stdout) on
`router.yaml`: what a pod's readiness waits for, and every restart and scale-up. Trials interleaved
with another checkout's router when `--compare` names one (the same venv, model and machine).

    python -m bench.runtime.startup [--trials 5] [--compare ../before] [--out build/bench-startup.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.report import emit
from devstack.stack import ROOT, free_port


def ready_seconds(tree: Path) -> float:
    """Seconds from starting `tree`'s router on its own router.yaml to its saying it is ready."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "esr_app", "serve", "--config", str(tree / "router.yaml"), "--grpc-port",
         str(free_port()), "--metrics-port", str(free_port()), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)})
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("router ready"):
                return time.monotonic() - started
        raise RuntimeError(f"the router of {tree} exited with {proc.wait()} before it was ready")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--compare", type=Path, help="another checkout, its router timed in the same run")
    p.add_argument("--out")
    args = p.parse_args()
    trees = {"this tree": ROOT, **({str(args.compare): args.compare.resolve()} if args.compare else {})}
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.trials):
        for name, tree in trees.items():
            seconds[name].append(round(ready_seconds(tree), 2))
    rows = [{"tree": name, "median_s": statistics.median(s), "min_s": min(s), "max_s": max(s), "trials_s": s}
            for name, s in seconds.items()]
    emit({"rows": rows}, args.out, ("tree", "median_s", "min_s", "max_s"))


if __name__ == "__main__":
    main()
