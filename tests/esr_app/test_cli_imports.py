"""The command line's composition: serving imports no tuning code (esr_tuning, the offline
commands), which load when an offline command runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from esr_app.cli import build_parser
from esr_tuning.evaluation import SHIFTED_DEFAULT_SHARE
from esr_tuning.fit import OBJECTIVES
from tests.support import ROOT


@pytest.mark.processes
def test_serve_imports_no_tuning_code():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "esr_app", "serve", "--help"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    assert "esr_app.cli" in imported
    assert not [m for m in imported if m.startswith(("esr_tuning", "esr_app.quality_cli"))]


def test_fits_flags_name_the_tuning_codes_own_choices_and_default():
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    fit = {a.dest: a for a in sub.choices["fit"]._actions}
    assert fit["objective"].metavar == "{" + ",".join(OBJECTIVES) + "}"
    assert fit["objective"].default in OBJECTIVES
    assert fit["confidence_default_share"].default is None  # resolved by cmd_fit to SHIFTED_DEFAULT_SHARE
    assert f"default {SHIFTED_DEFAULT_SHARE:g}" in fit["confidence_default_share"].help
