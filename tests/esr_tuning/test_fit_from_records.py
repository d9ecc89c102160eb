"""fit --from-records as a team runs it: recorded traffic (texts, no labels) in, a static tier fitted
to the encoder's own decisions out, judged on records it did not learn from; then the replay gate.
On a slice of CLINC150 (Larson et al. 2019, CC BY 3.0) from ../shared."""

from __future__ import annotations

import json

import pytest

from esr_config import load_config
from esr_tuning.records_fit import held_out
from esr_tuning.replay import Recorded, read_records
from router.rules import RequestFacts
from tests.support.quality import cli, clinc_slice


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return clinc_slice(tmp_path_factory.mktemp("clinc-records"))


def _records(path, texts, route="banking", tier="static"):
    """Records as the server writes them (records.prompts on), every one claiming `route`: the refit
    must learn the encoder's decisions, not what a record says."""
    with open(path, "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"time": 1.0 + i, "trace_id": f"{i:032x}", "route": route, "model": "banking-model",
                                "reason": "matched", "score": 0.9, "confidence": 0.9, "tier": tier,
                                "facts": {"prompt_tokens": 8}, "texts": [text]}) + "\n")


@pytest.mark.processes
def test_the_static_tier_learns_the_encoders_decisions_on_recorded_traffic_and_the_replay_gate_names_moves(data):
    texts = [json.loads(line)["text"] for line in (data / "train.jsonl").read_text().splitlines()]
    records = data / "records.jsonl"
    _records(records, texts)
    cut = data / "cut.jsonl"  # another replica's file, cut short by a disk that filled mid-line
    cut.write_text('{"route": "banking", "reason": "matched", "texts": ["cut sh\n')
    refit, report = data / "refit.yaml", data / "refit.json"
    out = cli("fit", "--config", str(data / "clinc.yaml"), "--from-records", str(records), "--from-records", str(cut),
              "--out", str(refit), "--report", str(report))
    assert out.returncode == 0, out.stderr
    assert "held-out records" in out.stdout and "static share" in out.stdout
    assert "malformed 1" in out.stdout  # counted and skipped: the refit learns from what is there
    figures = json.loads(report.read_text())
    after = figures["after"]
    # Every record said "banking"; the tier learnt what the encoder decides, so it agrees with it.
    assert after["static_share"] > 0.1 and after["agreement"] >= 0.99, figures
    assert sum(1 for r in after["routes"].values() if r["static_share"]) >= 3
    fitted = load_config(refit).static_tier
    assert fitted.accept and any(v != float("inf") for v in fitted.accept.values())
    # The gate: replay the records with the refitted config; the records that move are named.
    gate = cli("replay", "--config", str(refit), "--records", str(records), "--json", "--max-changed", "1.0")
    assert gate.returncode == 0, gate.stderr
    moved = json.loads(gate.stdout)["moved_records"]
    assert moved and all(m["from"] == "banking" and m["to"] != "banking" and m["line"] >= 1 for m in moved)
    assert cli("replay", "--config", str(refit), "--records", str(records), "--max-changed", "0.01").returncode == 3


@pytest.mark.processes
def test_a_head_configs_static_head_learns_the_encoder_through_a_hidden_layer(data):
    import numpy as np

    head_config = data / "head.yaml"
    assert cli("fit", "--config", str(data / "clinc.yaml"), "--data", str(data / "train.jsonl"), "--head",
               "--out", str(head_config)).returncode == 0
    texts = [json.loads(line)["text"] for line in (data / "val.jsonl").read_text().splitlines()]
    records = data / "head-records.jsonl"
    _records(records, texts * 3)  # repeated prompts teach once and never sit on both sides
    refit, report = data / "head-refit.yaml", data / "head-refit.json"
    out = cli("fit", "--config", str(head_config), "--from-records", str(records), "--out", str(refit),
              "--report", str(report))
    assert out.returncode == 0, out.stderr
    assert "repeated" in out.stdout
    figures = json.loads(report.read_text())
    assert figures["after"]["agreement"] >= 1 - 0.005 - 0.02, figures  # the budget, and the held-out's noise
    with np.load(load_config(refit).static_tier.head_path) as head:
        assert head["hidden_weight"].shape[0] == 512


@pytest.mark.processes
def test_too_few_records_or_none_with_texts_is_a_clear_error(data, tmp_path):
    records = tmp_path / "records.jsonl"
    _records(records, ["what is my balance"] * 3)
    out = cli("fit", "--config", str(data / "clinc.yaml"), "--from-records", str(records), "--out", str(tmp_path / "o.yaml"))
    assert out.returncode == 2 and "records.prompts must be on" in out.stderr
    assert cli("fit", "--config", str(data / "clinc.yaml"), "--out", str(tmp_path / "o.yaml")).returncode == 2


def test_the_held_out_side_of_a_record_is_fixed_by_its_texts():
    def rec(text):
        return Recorded((text,), RequestFacts(1), "r", "m", "matched", 0.9)

    first = [rec(f"prompt {i}") for i in range(1000)]
    teach, judge = held_out(first, 0.2)
    assert 150 < len(judge) < 250
    # A grown file judges by the same records, and a repeated prompt never sits on both sides.
    teach2, judge2 = held_out(first + [rec(f"prompt {i}") for i in range(1000, 1500)] + first[:100], 0.2)
    assert {r.texts for r in judge} <= {r.texts for r in judge2}
    assert not {r.texts for r in teach2} & {r.texts for r in judge2}
    # A prompt sent alone and as a conversation's newest turn sits on one side; a labelled one is never judged.
    alone, turn = rec("prompt 7"), Recorded(("hello", "prompt 7"), RequestFacts(1), "r", "m", "context", 0.9)
    sides = held_out([alone, turn], 0.5)
    assert sorted(len(side) for side in sides) == [0, 2]
    assert held_out([rec(f"prompt {i}") for i in range(100)], 1.0, labelled=["prompt 3"])[0] == [rec("prompt 3")]


def test_records_are_read_with_their_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    _records(path, ["a", "b"])
    records, _ = read_records(path)
    assert [r.line for r in records] == [1, 2] and records[1].trace_id == f"{1:032x}"
