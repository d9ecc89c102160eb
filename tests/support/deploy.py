"""The deploy manifests as the cluster gets them: rendered by the real kustomize, checked by the real
tools (`make tools` installs them; a test that needs one it cannot find fails saying so)."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from tests.support import ROOT

K8S = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.33"


def tool(name: str, env: str | None = None) -> str:
    local = ROOT / "build" / "tools" / "node_modules" / ".bin" / name  # where `make tools` puts npm-shipped tools
    found = (os.environ.get(env) if env else None) or shutil.which(name) or (str(local) if local.exists() else None)
    if not found or not Path(found).exists():
        pytest.fail(f"`{name}` is needed for this test; `make test` installs it (make tools)", pytrace=False)
    return found


def kustomize(path: Path) -> list[dict]:
    """The objects kustomize renders of `path`, each caller's own to change."""
    return [d for d in yaml.safe_load_all(_rendered(Path(path).resolve())) if d]


@lru_cache(maxsize=None)
def _rendered(path: Path) -> str:
    # Once a session per folder: the tree's manifests do not change under the tests, and a run costs
    # about two seconds (the schema checks render each gateway's a dozen times).
    out = subprocess.run([tool("kustomize", "KUSTOMIZE"), "build", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout
