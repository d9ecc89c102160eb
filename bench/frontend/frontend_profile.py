"""Where the one-process router spends its CPU on the pinned path: py-spy samples of the router
under wrk c64 through the real Envoy, summed by innermost frame and by any frame.

    python -m bench.frontend.frontend_profile [--seconds 12]     # needs py-spy (pip install py-spy) and wrk
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.harness import PINNED_SCRIPT, Gateway
from bench.harness import WRK_SCRIPT, run_wrk


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.frontend.frontend_profile")
    p.add_argument("--seconds", type=int, default=12)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    spy = shutil.which("py-spy")
    if not spy or not shutil.which("wrk"):
        raise SystemExit("needs py-spy (pip install py-spy) and wrk (apt-get install wrk)")
    workdir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    script = workdir / "pinned.lua"
    script.write_text(PINNED_SCRIPT + WRK_SCRIPT[WRK_SCRIPT.index("function response"):])
    gateway = Gateway("inprocess", workdir, 1, None)
    try:
        run_wrk(gateway.listener, 16, 2, script)
        raw = workdir / "samples.txt"
        recorder = subprocess.Popen([spy, "record", "-p", str(gateway.router.pid), "-d", str(args.seconds), "-r", "200",
                                     "-f", "raw", "-o", str(raw), "--nonblocking", "--threads"])
        run_wrk(gateway.listener, 64, args.seconds, script)
        recorder.wait()
    finally:
        gateway.close()
    innermost, anywhere, total = collections.Counter(), collections.Counter(), 0
    for line in raw.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        total += int(count)
        innermost[frames[-1]] += int(count)
        for frame in set(frames):
            anywhere[frame] += int(count)
    for title, counter in (("innermost frame", innermost), ("any frame", anywhere)):
        print(f"\n{title} ({total} samples)")
        for frame, n in counter.most_common(args.top):
            print(f"{n / total:6.1%}  {frame[:140]}")


if __name__ == "__main__":
    main()
