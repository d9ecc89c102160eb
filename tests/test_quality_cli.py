"""eval / fit as a user runs them, on a slice of CLINC150 (Larson et al. 2019, CC BY 3.0) from ../shared."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from esr_config import load_config

from tests.conftest import ROOT

CLINC = ROOT.parent / "shared" / "data" / "clinc150"


def _slice(src: Path, dst: Path, per_label: int) -> None:
    kept: dict[str, int] = defaultdict(int)
    with open(src) as f, open(dst, "w") as out:
        for line in f:
            label = json.loads(line)["label"]
            if kept[label] < per_label:
                kept[label] += 1
                out.write(line)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "esr_app", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    if not (CLINC / "train.jsonl").exists():
        pytest.fail(f"CLINC150 data missing at {CLINC} (it ships in ../shared beside the project)", pytrace=False)
    d = tmp_path_factory.mktemp("clinc")
    _slice(CLINC / "train.jsonl", d / "train.jsonl", 60)
    _slice(CLINC / "val.jsonl", d / "val.jsonl", 25)
    subprocess.run([sys.executable, "examples/clinc150/build_config.py", "--train", str(d / "train.jsonl"),
                    "--out", str(d / "clinc.yaml"), "--per-route", "30"], check=True, cwd=ROOT, timeout=60)
    return d


def test_eval_json_and_table(data):
    out = cli("eval", "--config", str(data / "clinc.yaml"), "--data", str(data / "val.jsonl"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert 0.5 < report["accuracy"] <= 1.0
    assert set(report["per_route"]) >= {"banking", "travel", "out_of_scope"}
    assert sum(report["confusion"]["banking"].values()) == 25
    table = cli("eval", "--config", str(data / "clinc.yaml"), "--data", str(data / "val.jsonl"))
    assert "accuracy:" in table.stdout and "confusion" in table.stdout


def test_fit_head_writes_a_config_that_serves(data):
    out_cfg = data / "fitted.yaml"
    out = cli("fit", "--config", str(data / "clinc.yaml"), "--data", str(data / "train.jsonl"), "--head",
              "--min-default-recall", "0.8", "--out", str(out_cfg))
    assert out.returncode == 0, out.stderr
    assert "before" in out.stdout and "after" in out.stdout
    assert "head_score=probability" in out.stdout and "head_score=energy" in out.stdout
    assert load_config(out_cfg).classifier.head_score in {"probability", "energy"}
    assert (data / "fitted.head.npz").exists()
    ev = cli("eval", "--config", str(out_cfg), "--data", str(data / "val.jsonl"), "--json")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["accuracy"] >= 0.8
    cls = cli("classify", "--config", str(out_cfg), "--json", "please transfer 200 dollars from my checking to my savings account")
    assert json.loads(cls.stdout)["route"] in {"banking", "out_of_scope"}, cls.stdout + cls.stderr


def test_refit_onto_another_score_scale_writes_a_config_that_loads(data, tmp_path):
    # A hand-set energy default_threshold and gate (above 1) under a probability head: fit resets
    # them, and the written file must say so, or it is refused at load.
    fitted = yaml.safe_load((data / "clinc.yaml").read_text())
    fitted["classifier"] = {"method": "head", "head_score": "energy"}
    fitted["default_threshold"] = 7.0
    fitted["conversation"] = {"policy": "track", "max_turns": 4, "gate": 9.0}
    source = tmp_path / "energy.yaml"
    source.write_text(yaml.safe_dump(fitted))
    out_cfg = tmp_path / "probability.yaml"
    out = cli("fit", "--config", str(source), "--data", str(data / "train.jsonl"), "--head", "--head-score",
              "probability", "--out", str(out_cfg))
    assert out.returncode == 0, out.stderr
    assert "conversation.gate 9.0 dropped" in out.stdout
    written = load_config(out_cfg)
    assert written.default_threshold == 0.5 and written.conversation.gate is None
    assert written.conversation.max_turns == 4  # the rest of the section stays
    ev = cli("eval", "--config", str(out_cfg), "--data", str(data / "val.jsonl"), "--json")
    assert ev.returncode == 0, ev.stderr


def test_eval_rejects_unknown_labels(data, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hi", "label": "nope"}\n')
    out = cli("eval", "--config", str(data / "clinc.yaml"), "--data", str(bad))
    assert out.returncode == 2
    assert "bad.jsonl:1: label 'nope'" in out.stderr


# Conversations: a slice of SGD (Rastogi et al., AAAI 2020, CC BY-SA 4.0) from ../shared.

SGD = ROOT.parent / "shared" / "data" / "sgd"


def _every(src: Path, dst: Path, step: int, domains: set[str] | None = None) -> set[str]:
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


@pytest.fixture(scope="module")
def sgd(tmp_path_factory):
    if not (SGD / "train.jsonl").exists():
        pytest.fail(f"SGD data missing at {SGD} (it ships in ../shared beside the project)", pytrace=False)
    d = tmp_path_factory.mktemp("sgd")
    domains = _every(SGD / "train.jsonl", d / "train.jsonl", 8)
    _every(SGD / "dev.jsonl", d / "dev.jsonl", 8, domains)
    subprocess.run([sys.executable, "examples/sgd/build_config.py", "--train", str(d / "train.jsonl"),
                    "--out", str(d / "sgd.yaml"), "--per-route", "20"], check=True, cwd=ROOT, timeout=60)
    return d


def test_fit_on_conversations_tunes_a_gate_that_keeps_follow_ups_on_their_route(sgd):
    before = cli("eval", "--config", str(sgd / "sgd.yaml"), "--data", str(sgd / "dev.jsonl"), "--json")
    assert before.returncode == 0, before.stderr
    before = json.loads(before.stdout)["conversation"]
    out = cli("fit", "--config", str(sgd / "sgd.yaml"), "--data", str(sgd / "train.jsonl"), "--head",
              "--out", str(sgd / "fitted.yaml"))
    assert out.returncode == 0, out.stderr
    assert "conversation gate" in out.stdout and "short_followups" in out.stdout
    fitted = load_config(sgd / "fitted.yaml")
    gate = fitted.conversation.gate
    assert fitted.conversation.policy == "track" and isinstance(gate, float)
    if fitted.classifier.head_score == "probability":
        assert 0 < gate < 1
    # Both head scores were weighed; SGD has no default-route examples, so on plain accuracy.
    assert "head_score=probability: accuracy" in out.stdout and "head_score=energy: accuracy" in out.stdout
    assert (sgd / "fitted.yaml").read_text().startswith("# Generated from the Schema-Guided Dialogue")  # credit kept
    after = cli("eval", "--config", str(sgd / "fitted.yaml"), "--data", str(sgd / "dev.jsonl"), "--json")
    assert after.returncode == 0, after.stderr
    report = json.loads(after.stdout)
    after = report["conversation"]
    assert after["turns"] == report["examples"] == sum(len(json.loads(line)["labels"]) for line in open(sgd / "dev.jsonl"))
    # Routed on the last turn alone, short follow-ups mostly miss; with the fitted gate they keep their route.
    assert before["short_followups"] < 0.6 and after["short_followups"] > before["short_followups"] + 0.25
    assert after["all_turns"] > 0.8 and after["topic_changes"] > 0.7


def test_conversation_data_errors_name_the_line(sgd, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}], "labels": []}\n')
    out = cli("eval", "--config", str(sgd / "sgd.yaml"), "--data", str(bad))
    assert out.returncode == 2
    assert "bad.jsonl:1: 0 labels for 1 user messages" in out.stderr


def test_fit_finetune_writes_a_local_model_the_config_loads(data, tmp_path):
    small = tmp_path / "train.jsonl"
    _slice(CLINC / "train.jsonl", small, 12)
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
