"""The deploy manifests as the cluster gets them: rendered by the real kustomize, checked by the real
tools (`make tools` installs them; a test that needs one it cannot find fails saying so)."""

from __future__ import annotations

import os
import shutil
import subprocess
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
    out = subprocess.run([tool("kustomize", "KUSTOMIZE"), "build", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]
