"""Replay against serving at scale: N held-out prompts (CLINC150 val, as written) sent through a real
Envoy and router on a config, concurrently (so the router embeds them in shared batches, as under
traffic), with decision records on (texts kept); then `semantic-router replay` against the same
config. Every decision must come out the same: what `eval` and `replay` compute offline is what the
server decides.

    python -m bench.observe.replay_bench [--config router.yaml] [--requests 1000] [--concurrency 16] [--out r.json]

Needs envoy and ../shared/data/clinc150.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.report import emit
from devstack.stack import ROOT, stack_with


async def _send(url: str, texts: list[str], concurrency: int) -> int:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def one(text: str) -> int:
            async with gate:
                r = await http.post("/v1/chat/completions",
                                    json={"model": "auto", "messages": [{"role": "user", "content": text}]})
                return r.status_code
        return sum(code == 200 for code in await asyncio.gather(*(one(t) for t in texts)))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.observe.replay_bench")
    p.add_argument("--config", type=Path, default=ROOT / "router.yaml")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/clinc150/val.jsonl")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--out")
    args = p.parse_args()
    texts = [json.loads(line)["text"] for line in args.data.read_text().splitlines() if line.strip()][: args.requests]
    work = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    records = work / "records.jsonl"
    base = yaml.safe_load(args.config.read_text())
    for section, key in (("classifier", "head_path"), ("static_tier", "head_path"), ("encoder", "model")):
        value = (base.get(section) or {}).get(key)  # a fitted config names its files beside it
        if isinstance(value, str) and (args.config.parent / value).exists():
            base[section][key] = str((args.config.parent / value).resolve())

    def change(config: dict) -> None:
        config.clear()
        config.update(base)
        config["records"] = {"enabled": True, "path": str(records), "prompts": True, "max_per_s": 1e6}
        config.setdefault("server", {})["deadline_ms"] = 30000  # decisions, not fallbacks, are compared

    (work / "stack").mkdir()
    with stack_with(work / "stack", change) as stack:
        started = time.monotonic()
        ok = asyncio.run(_send(stack.url, texts, args.concurrency))
        sent_s = time.monotonic() - started
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not records.exists() or len(records.read_text().splitlines()) < ok):
            time.sleep(0.2)
        config = Path(stack.router_config)
        out = subprocess.run([sys.executable, "-m", "esr_app", "replay", "--config", str(config), "--records",
                              str(records), "--json"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    replayed = json.loads(out.stdout)
    row = {"requests": len(texts), "answered": ok, "seconds": round(sent_s, 1), "replayed": replayed["records"],
           "left_out": replayed["left_out"], "changed": replayed["changed"], "moved": replayed["moved"]}
    checks = {f"replay of {replayed['records']} recorded requests against the serving config (target 0 changed)": {
        "ok": replayed["changed"] == 0 and replayed["records"] == len(texts), "detail": f"{replayed['changed']} changed"}}
    emit({"benchmark": "replay", "config": str(args.config), "rows": [row], "checks": checks}, args.out,
         columns=("requests", "answered", "seconds", "replayed", "changed"))


if __name__ == "__main__":
    main()
