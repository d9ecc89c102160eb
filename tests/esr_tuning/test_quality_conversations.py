"""eval / fit on conversations as a user runs them, on a slice of the Schema-Guided Dialogue dataset
(Rastogi et al., AAAI 2020, CC BY-SA 4.0) from ../shared."""

from __future__ import annotations

import json

import pytest

from esr_config import load_config
from tests.support.quality import cli, sgd_slice


@pytest.fixture(scope="module")
def sgd(tmp_path_factory):
    return sgd_slice(tmp_path_factory.mktemp("sgd"))


@pytest.mark.processes
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
    # The static tier (on by default on the CPU): a head and table rows trained on the turns, both served.
    assert fitted.static_tier.head_path and fitted.static_tier.table_path == str(sgd / "fitted.static-table.npz")
    after = cli("eval", "--config", str(sgd / "fitted.yaml"), "--data", str(sgd / "dev.jsonl"), "--json")
    assert after.returncode == 0, after.stderr
    report = json.loads(after.stdout)
    after = report["conversation"]
    assert after["turns"] == report["examples"] == sum(len(json.loads(line)["labels"]) for line in open(sgd / "dev.jsonl"))
    # Routed on the last turn alone, short follow-ups mostly miss; with the fitted gate they keep their route.
    assert before["short_followups"] < 0.6 and after["short_followups"] > before["short_followups"] + 0.25
    assert after["all_turns"] > 0.8 and after["topic_changes"] > 0.7


@pytest.mark.processes
def test_conversation_data_errors_name_the_line(sgd, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}], "labels": []}\n')
    out = cli("eval", "--config", str(sgd / "sgd.yaml"), "--data", str(bad))
    assert out.returncode == 2
    assert "bad.jsonl:1: 0 labels for 1 user messages" in out.stderr
