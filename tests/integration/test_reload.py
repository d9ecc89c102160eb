"""Hot reload of a running router: file change and SIGHUP swap routes; a bad file changes nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import yaml

from devstack.stack import ROOT, free_port
from tests.support.extproc import route_once
from tests.support.stack import metric
from tests.support.waiting import wait_for


@pytest.fixture
def router(tmp_path):
    cfg = yaml.safe_load((ROOT / "router.yaml").read_text())
    cfg["server"]["watch_config_s"] = 0.2
    cfg["cache_size"] = 0
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(cfg))
    grpc_port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "esr_app", "serve", "--config", str(path), "--grpc-port", str(grpc_port),
         "--metrics-port", str(metrics_port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    for line in proc.stdout:
        if line.startswith("router ready"):
            break
    else:
        pytest.fail("router did not start")
    yield proc, path, cfg, grpc_port, metrics_port
    proc.terminate()
    proc.wait(30)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def reloads(port: int, result: str) -> float:
    return metric(scrape(port), "semantic_router_config_reloads_total", f'result="{result}"')


def versions(port: int) -> dict[str, str]:
    """process -> the config version it serves (semantic_router_config_version == 1)."""
    import re
    return {m.group(1): m.group(2) for m in re.finditer(
        r'^semantic_router_config_version\{process="([^"]+)",version="([^"]+)"\} 1\.0$', scrape(port), re.M)}


def test_file_edit_swaps_routes_and_bad_file_keeps_old(router):
    proc, path, cfg, port, metrics_port = router
    prompt = "what is the capital of France and its population"
    assert route_once(port, prompt)["x-semantic-route"] == "general"
    (first,) = versions(metrics_port).values()

    # Traffic during the reload: every request must get an answer with a route.
    answers, stop = [], threading.Event()

    def traffic():
        while not stop.is_set():
            answers.append(route_once(port, "solve 3x + 5 = 20").get("x-semantic-route"))

    sender = threading.Thread(target=traffic)
    sender.start()
    cfg["routes"].append({"name": "geography", "model": "general-model",
                          "utterances": ["what is the capital of France", "which country has the largest population"]})
    path.write_text(yaml.safe_dump(cfg))
    try:
        wait_for(lambda: route_once(port, prompt)["x-semantic-route"] == "geography", 30, "reload applied", 0.1)
    finally:
        time.sleep(0.3)
        stop.set()
        sender.join()
    assert reloads(metrics_port, "ok") >= 1
    assert len(answers) > 5 and set(answers) == {"math"}, set(answers)  # none refused for the reload
    (second,) = versions(metrics_port).values()
    assert second != first

    path.write_text("routes: [this is: not valid")
    wait_for(lambda: reloads(metrics_port, "error") >= 1, 30, "bad config counted", 0.1)
    assert route_once(port, prompt)["x-semantic-route"] == "geography"  # old config still serving

    cfg["routes"] = [r for r in cfg["routes"] if r["name"] != "geography"]
    cfg["server"]["watch_config_s"] = 0.2
    path.write_text(yaml.safe_dump(cfg))
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: route_once(port, prompt)["x-semantic-route"] == "general", 30, "SIGHUP reload applied", 0.1)
