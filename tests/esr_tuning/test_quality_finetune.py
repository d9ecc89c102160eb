"""fit --finetune as a user runs it, on a slice of CLINC150 (Larson et al. 2019, CC BY 3.0) from ../shared:
the slowest of the offline commands, in a module of its own so that the suite's workers share it out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.support import ROOT
from tests.support.quality import CLINC, cli, clinc_slice, slice_per_label


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return clinc_slice(tmp_path_factory.mktemp("clinc"))


@pytest.mark.processes
def test_fit_finetune_writes_a_local_model_the_config_loads(data, tmp_path):
    small = tmp_path / "train.jsonl"
    slice_per_label(CLINC / "train.jsonl", small, 12)
    out_cfg = tmp_path / "tuned.yaml"
    out = cli("fit", "--config", str(data / "clinc.yaml"), "--data", str(small), "--head", "--finetune",
              "--finetune-epochs", "1", "--out", str(out_cfg))
    assert out.returncode == 0, out.stderr
    assert "fine-tuned bundled:all-MiniLM-L6-v2 on" in out.stdout
    assert (tmp_path / "tuned.model" / "config_sentence_transformers.json").exists()
    written = yaml.safe_load(out_cfg.read_text())
    assert written["encoder"]["model"] == "tuned.model"  # beside the config: the pair moves together
    # Loaded from another working directory: the model is found beside the config.
    ev = subprocess.run([sys.executable, "-m", "esr_app", "eval", "--config", str(out_cfg), "--data", str(data / "val.jsonl"),
                         "--json", "--html", str(tmp_path / "report.html")],
                        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**__import__("os").environ,
                                                                                          "PYTHONPATH": str(ROOT)})
    assert ev.returncode == 0, ev.stderr
    report = json.loads(ev.stdout)
    assert report["accuracy"] > 0.5 and report["shifted"]["default_share"] == 0.2
    page = (tmp_path / "report.html").read_text()
    # one score histogram per route, and the confidence's reliability diagram
    assert page.startswith("<!doctype html>") and page.count("<svg") == 11 and "Reliability" in page
    assert 0 <= report["confidence"]["ece"] <= 1 and written["calibration"]["examples"] > 0
    assert "Confusion matrix" in page and "banking" in page
