"""The suite polices itself: a test that hangs fails with its stack instead of holding CI to its
own limit (pytest-timeout, `timeout` in pyproject.toml)."""

from __future__ import annotations

import pytest

import subprocess
import sys
import tomllib

from tests.support import ROOT


def test_the_suite_sets_a_per_test_limit():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < options["timeout"] <= 600


@pytest.mark.processes
def test_a_hanging_test_fails_with_its_stack(tmp_path):
    (tmp_path / "test_hang.py").write_text("import threading\n\n\ndef test_hangs():\n    threading.Event().wait()\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=2",
                          "test_hang.py"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Timeout" in out.stdout and "test_hangs" in out.stdout and "threading.Event().wait()" in out.stdout
