"""A real Prometheus server scrapes the router during a short load; its HTTP API reads the series back."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml

from devstack.stack import free_port
from esr_settings import replace_at
from tests.support.waiting import wait_for


@pytest.fixture
def prometheus(stack, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the prometheus server is needed; `make test` installs Debian's package (make tools)", pytrace=False)
    port = free_port()
    cfg = {"global": {"scrape_interval": "1s"},
           "scrape_configs": [{"job_name": "semantic-router",
                               "static_configs": [{"targets": [f"127.0.0.1:{stack.ports.router_metrics}"]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(30)


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
    except OSError:
        return []
    return body["data"]["result"] if body.get("status") == "success" else []


def test_prometheus_scrapes_batches_and_routes(stack, prometheus):
    wait_for(lambda: query(prometheus, 'up{job="semantic-router"} == 1'), 60, "Prometheus sees the router up", 0.5)
    prompts = [f"solve the equation {i}x + 1 = {i + 7}" for i in range(150)] + \
              [f"write a python function number {i} that parses json" for i in range(150)]
    with ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(lambda p: httpx.post(
            f"{stack.url}/v1/chat/completions", timeout=30,
            json={"model": "auto", "messages": [{"role": "user", "content": p}]}).status_code, prompts))
    assert set(statuses) == {200}
    batches = wait_for(lambda: query(prometheus, "sum(semantic_router_batch_size_count) > 0"), 60,
                       "batch sizes scraped", 0.5)
    assert float(batches[0]["value"][1]) > 0
    wait_for(lambda: query(prometheus, 'semantic_router_batch_size_bucket{le="64.0"}'), 60, "histogram buckets scraped", 0.5)
    wait_for(lambda: {"math", "code"} <= {s["metric"]["route"] for s in query(prometheus, "semantic_router_route_decisions_total")},
             60, "route counters scraped", 0.5)
    mean = query(prometheus, "sum(semantic_router_batch_size_sum) / sum(semantic_router_batch_size_count)")
    assert mean and float(mean[0]["value"][1]) >= 1.0


def test_envoys_stats_port_serves_what_the_alerts_read_and_nothing_of_the_admin(tmp_path, envoy_binary):
    """The rendered stats listener (envoy.stats_port) answers /stats/prometheus with the ext_proc
    counters the fail-open alerts use; the admin's other endpoints (drain, quit) are not reachable."""

    from devstack.stack import ROOT, free_port
    from esr_config import load_config
    from tests.support.stack import envoy_alone, envoy_series

    cfg = load_config(ROOT / "router.yaml")
    listen, admin, stats = free_port(), free_port(), free_port()
    cfg = replace_at(cfg, "envoy", listen_port=listen, admin_port=admin,
                                                             stats_port=stats)
    with envoy_alone(envoy_binary, cfg, tmp_path) as envoy:
        text = httpx.get(f"http://127.0.0.1:{stats}/stats/prometheus", timeout=10).text
        rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"][0]["rules"]
        used = {n for r in rules for n in envoy_series(r["expr"])}
        assert used >= {"envoy_http_ext_proc_failure_mode_allowed", "envoy_http_ext_proc_streams_failed"}
        exported = set(re.findall(r"^(envoy_[a-z0-9_]+)\{", text, re.M))
        assert used <= exported, used - exported
        assert httpx.post(f"http://127.0.0.1:{stats}/quitquitquit", timeout=10).status_code == 404
        assert httpx.get(f"http://127.0.0.1:{stats}/config_dump", timeout=10).status_code == 404
        assert envoy.poll() is None
