"""The offline commands as a user runs them, on slices of the data sets in ../shared: CLINC150
(Larson et al., EMNLP 2019, CC BY 3.0) and the Schema-Guided Dialogue dataset (Rastogi et al.,
AAAI 2020, CC BY-SA 4.0). Neither is copied here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support import ROOT

CLINC = ROOT.parent / "shared" / "data" / "clinc150"
SGD = ROOT.parent / "shared" / "data" / "sgd"


def slice_per_label(src: Path, dst: Path, per_label: int) -> None:
    kept: dict[str, int] = defaultdict(int)
    with open(src) as f, open(dst, "w") as out:
        for line in f:
            label = json.loads(line)["label"]
            if kept[label] < per_label:
                kept[label] += 1
                out.write(line)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "esr_app", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def every_nth(src: Path, dst: Path, step: int, domains: set[str] | None = None) -> set[str]:
    """Every `step`-th dialogue (the file is grouped by services), only those within `domains`."""
    kept, seen = [], set()
    with open(src) as f:
        for i, line in enumerate(f):
            labels = set(json.loads(line)["labels"])
            if i % step == 0 and (domains is None or labels <= domains):
                kept.append(line)
                seen |= labels
    dst.write_text("".join(kept))
    return seen



def clinc_slice(folder: Path) -> Path:
    """60 training and 25 validation examples per intent, and a config built from them, in `folder`."""
    if not (CLINC / "train.jsonl").exists():
        pytest.fail(f"CLINC150 data missing at {CLINC} (it ships in ../shared beside the project)", pytrace=False)
    slice_per_label(CLINC / "train.jsonl", folder / "train.jsonl", 60)
    slice_per_label(CLINC / "val.jsonl", folder / "val.jsonl", 25)
    subprocess.run([sys.executable, "examples/clinc150/build_config.py", "--train", str(folder / "train.jsonl"),
                    "--out", str(folder / "clinc.yaml"), "--per-route", "30"], check=True, cwd=ROOT, timeout=60)
    return folder


def sgd_slice(folder: Path) -> Path:
    """Every 16th SGD train dialogue and every 8th dev one within the same domains, and a config built
    from them. (Every 8th train dialogue took the fit twice as long for the same dev figures.)"""
    if not (SGD / "train.jsonl").exists():
        pytest.fail(f"SGD data missing at {SGD} (it ships in ../shared beside the project)", pytrace=False)
    domains = every_nth(SGD / "train.jsonl", folder / "train.jsonl", 16)
    every_nth(SGD / "dev.jsonl", folder / "dev.jsonl", 8, domains)
    subprocess.run([sys.executable, "examples/sgd/build_config.py", "--train", str(folder / "train.jsonl"),
                    "--out", str(folder / "sgd.yaml"), "--per-route", "20"], check=True, cwd=ROOT, timeout=60)
    return folder
