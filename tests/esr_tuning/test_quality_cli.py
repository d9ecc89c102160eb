"""eval / fit as a user runs them, on a slice of CLINC150 (Larson et al. 2019, CC BY 3.0) from ../shared."""

from __future__ import annotations

import json

import pytest
import yaml

from esr_config import load_config
from tests.support.quality import cli, clinc_slice


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return clinc_slice(tmp_path_factory.mktemp("clinc"))


@pytest.mark.processes
def test_eval_json_and_table(data):
    out = cli("eval", "--config", str(data / "clinc.yaml"), "--data", str(data / "val.jsonl"), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert 0.5 < report["accuracy"] <= 1.0
    assert set(report["per_route"]) >= {"banking", "travel", "out_of_scope"}
    assert sum(report["confusion"]["banking"].values()) == 25
    table = cli("eval", "--config", str(data / "clinc.yaml"), "--data", str(data / "val.jsonl"))
    assert "accuracy:" in table.stdout and "confusion" in table.stdout


@pytest.mark.processes
def test_fit_head_writes_a_config_that_serves(data):
    out_cfg = data / "fitted.yaml"
    out = cli("fit", "--config", str(data / "clinc.yaml"), "--data", str(data / "train.jsonl"), "--head",
              "--min-default-recall", "0.8", "--out", str(out_cfg))
    assert out.returncode == 0, out.stderr
    assert "before" in out.stdout and "after" in out.stdout
    assert "head_score=probability" in out.stdout and "head_score=energy" in out.stdout
    assert load_config(out_cfg).classifier.head_score in {"probability", "energy"}
    assert (data / "fitted.head.npz").exists()
    # The static tier (on by default on the CPU): its head and the table rows trained for it.
    fitted = load_config(out_cfg).static_tier
    assert fitted.head_path == str(data / "fitted.static-head.npz") and fitted.table_path == str(data / "fitted.static-table.npz")
    assert "rows of its table trained on" in out.stdout
    ev = cli("eval", "--config", str(out_cfg), "--data", str(data / "val.jsonl"), "--json")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["accuracy"] >= 0.8
    cls = cli("classify", "--config", str(out_cfg), "--json", "please transfer 200 dollars from my checking to my savings account")
    assert json.loads(cls.stdout)["route"] in {"banking", "out_of_scope"}, cls.stdout + cls.stderr


@pytest.mark.processes
def test_refit_onto_another_score_scale_writes_a_config_that_loads(data, tmp_path):
    # A hand-set energy default_threshold and gate (above 1) under a probability head: fit resets
    # them, and the written file must say so, or it is refused at load. So with a fitted static
    # tier's energy thresholds and margins (a fitted config fitted again).
    fitted = yaml.safe_load((data / "clinc.yaml").read_text())
    fitted["classifier"] = {"method": "head", "head_score": "energy"}
    fitted["default_threshold"] = 7.0
    fitted["conversation"] = {"policy": "track", "max_turns": 4, "gate": 9.0}
    fitted["static_tier"] = {"thresholds": {"banking": 6.5}, "accept": {"banking": 2.5}}
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
    assert all(-1 <= v <= 1 for v in written.static_tier.thresholds.values())  # fitted afresh
    ev = cli("eval", "--config", str(out_cfg), "--data", str(data / "val.jsonl"), "--json")
    assert ev.returncode == 0, ev.stderr


@pytest.mark.processes
def test_eval_rejects_unknown_labels(data, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hi", "label": "nope"}\n')
    out = cli("eval", "--config", str(data / "clinc.yaml"), "--data", str(bad))
    assert out.returncode == 2
    assert "bad.jsonl:1: label 'nope'" in out.stderr


@pytest.mark.processes
def test_eval_and_fit_measure_and_tune_the_caches_semantic_thresholds(data, tmp_path):
    raw = yaml.safe_load((data / "clinc.yaml").read_text())
    raw["cache"] = {"enabled": True, "semantic_routes": ["small_talk"]}
    source = tmp_path / "cached.yaml"
    source.write_text(yaml.safe_dump(raw))
    ev = cli("eval", "--config", str(source), "--data", str(data / "val.jsonl"), "--json")
    assert ev.returncode == 0, ev.stderr
    cache = json.loads(ev.stdout)["cache"]
    rows = cache["routes"]["small_talk"]
    assert [r["threshold"] for r in rows] == sorted(r["threshold"] for r in rows) and rows[0]["requests"] > 0
    assert all(r["false_share"] <= cache["max_false_share"] for r in rows if r["threshold"] >= cache["tuned_thresholds"]["small_talk"])
    out_cfg = tmp_path / "tuned.yaml"
    fit = cli("fit", "--config", str(source), "--data", str(data / "train.jsonl"), "--out", str(out_cfg))
    assert fit.returncode == 0, fit.stderr
    assert "response cache: semantic thresholds" in fit.stdout
    assert 0.5 <= load_config(out_cfg).cache.semantic_thresholds["small_talk"] <= 1.0


@pytest.mark.processes
def test_fit_on_guard_data_writes_a_static_screen_and_eval_screens_as_served(tmp_path):
    from tests.support.guard_texts import ATTACKS, BENIGN

    rows = [{"text": t, "label": "block", "category": "attack"} for t in ATTACKS] + \
        [{"text": t, "label": "allow", "category": "benign"} for t in BENIGN]
    data = tmp_path / "guard.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fitted = tmp_path / "guarded.yaml"
    out = cli("fit", "--config", "router.yaml", "--data", str(data), "--head", "--guard-fpr", "0.01",
              "--out", str(fitted))
    assert out.returncode == 0, out.stderr
    assert "static screen: clears" in out.stdout
    screen = yaml.safe_load(fitted.read_text())["filter_settings"]["prompt_guard"]["static_screen"]
    assert 0 < screen["below"] < 1 and len(screen["weights"]) == 256 and screen["table"]
    report = json.loads(cli("eval", "--config", str(fitted), "--data", str(data), "--json").stdout)
    assert report["screened"] > 0 and report["recall"] == 1.0  # it clears benign requests, never the caught attacks
