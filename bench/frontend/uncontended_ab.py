"""Uncontended ext_proc throughput at c64, this tree against another checkout, interleaved.

    python -m bench.frontend.uncontended_ab --other /path/to/other/checkout [--rounds 2] [--out result.json]

Each round starts one router from each tree (cache off, 30 s deadline: throughput, not fallbacks)
and runs 3 x 1,024 unique short prompts at concurrency 64 through the ext_proc interface. The
other checkout runs with its own code on PYTHONPATH, so any commit can be compared
(`git worktree add /tmp/base <commit>`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.report import emit

ONE_TREE = r"""
import asyncio, json, tempfile
from pathlib import Path
from bench.harness import ExtProcClient, closed_loop, start_router
from bench.workloads import short_prompts

async def main():
    proc, port = start_router(Path(tempfile.mkdtemp()), "cpu", None)
    client = ExtProcClient(port)
    await closed_loop(client.route, short_prompts(256, seed=3), 32, 256)  # warm-up
    rps = [(await closed_loop(client.route, short_prompts(1024, seed=10 + t), 64, 1024))["throughput_rps"]
           for t in range(3)]
    proc.terminate()
    proc.wait()
    print(json.dumps(rps))

asyncio.run(main())
"""


def trials(tree: Path) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", ONE_TREE], cwd=tree, env=env, capture_output=True, text=True,
                         timeout=600, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend.uncontended_ab")
    p.add_argument("--other", type=Path, required=True, help="another checkout of this project")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out")
    args = p.parse_args()
    here = Path(__file__).resolve().parents[2]
    got: dict[str, list[float]] = {"this": [], "other": []}
    for _ in range(args.rounds):
        got["other"] += trials(args.other.resolve())
        got["this"] += trials(here)
    rows = [{"workload": "short", "scenario": f"ext_proc_c64_{name}", "throughput_rps": sorted(v)[len(v) // 2],
             "trials_rps": v} for name, v in got.items()]
    ratio = rows[0]["throughput_rps"] / rows[1]["throughput_rps"]
    emit({"benchmark": "uncontended_ab", "other": str(args.other), "rows": rows,
          # Trials of one tree spread about +-7% on these shared machines: within 5% is "no worse".
          "checks": {"this tree no worse than other (median, c64, within 5%)": {
              "ok": ratio >= 0.95, "detail": f"{ratio:.2f}x"}}}, args.out)


if __name__ == "__main__":
    main()
