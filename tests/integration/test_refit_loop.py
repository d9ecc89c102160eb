"""The loop a team runs, through the real Envoy: serve with records (texts on) -> take the file ->
`fit --from-records` -> the `replay` gate -> hot reload -> the static tier decides more of the
traffic that follows, as the encoder would have."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import httpx
import pytest

from devstack.stack import ROOT, stack_with
from tests.support.traffic import prompts
from tests.support.waiting import wait_for

def send(stack, texts: list[str]) -> Counter:
    tiers: Counter = Counter()
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        for text in texts:
            r = http.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user", "content": text}]})
            assert r.status_code == 200
            tiers[r.headers.get("x-semantic-route-tier")] += 1
    return tiers


@pytest.fixture(scope="module")
def serving(tmp_path_factory, envoy_binary):
    work = tmp_path_factory.mktemp("refit-loop")

    def change(config: dict) -> None:
        config["records"] = {"enabled": True, "path": str(work / "records.jsonl"), "prompts": True}
        config["server"]["watch_config_s"] = 0.2
        config["cache_size"] = 0
    with stack_with(work, change) as stack:
        yield stack, work


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "esr_app", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_serve_refit_gate_reload_and_the_static_tier_decides_more(serving):
    stack, work = serving
    records = work / "records.jsonl"
    send(stack, prompts(300, seed=1))
    wait_for(lambda: records.exists() and len(records.read_text().splitlines()) >= 300, 10, "300 decision records")
    before = send(stack, prompts(120, seed=2))
    taken = work / "taken.jsonl"
    records.rename(taken)  # the job takes the file; the router writes a new one
    candidate = work / "candidate.yaml"
    fit = cli("fit", "--config", str(work / "router.yaml"), "--from-records", str(taken), "--out", str(candidate))
    assert fit.returncode == 0, fit.stderr
    gate = cli("replay", "--config", str(candidate), "--records", str(taken), "--max-changed", "0.02")
    assert gate.returncode == 0, gate.stdout + gate.stderr  # the refit moves (almost) no recorded decision
    taken.unlink()  # texts kept no longer than one refit
    (work / "router.yaml").write_text(candidate.read_text())
    wait_for(lambda: '"config reloaded"' in (work / "router.log").read_text(), 30, "the reload")
    after = send(stack, prompts(120, seed=2))
    assert after["static"] >= before["static"] + 8, (before, after)  # 41 -> 56 of 120 when written
    assert records.exists()  # the new file, written since the old one was taken
