"""What replay reads of a record file and what its report says (the decisions themselves are
compared with serving through the real Envoy: tests/integration/test_records_and_replay.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from esr_config import parse_config
from esr_tuning.jsonl import BadRecord
from esr_tuning.replay import format_report, read_records, report
from router.classifier import Decision
from tests.support import ROOT


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(route, model, reason="matched", **more):
    return {"route": route, "model": model, "reason": reason, "confidence": 0.9, "texts": ["x"],
            "facts": {"prompt_tokens": 1000}, **more}


def test_records_routing_did_not_decide_or_without_texts_are_left_out_and_counted(tmp_path):
    path = tmp_path / "r.jsonl"
    _write(path, [_row("math", "math-model"), _row("code", "code-model", "model_pinned"),
                  _row("general", "general-model", "fallback_timeout"), {**_row("math", "math-model"), "texts": None},
                  _row("math", "math-model", blocked=403), _row("general", "general-model", unread="body_too_large")])
    records, left_out = read_records(path)
    assert len(records) == 1
    assert left_out == {"model_pinned": 1, "fallback_timeout": 1, "no_texts": 1, "blocked": 1, "matched": 1}


def test_a_line_that_is_not_a_record_is_named(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_row("math", "math-model")) + "\n{\"route\": 1}\n")
    with pytest.raises(BadRecord, match=r"r.jsonl:2"):
        read_records(path)


def test_the_report_counts_moves_shares_and_cost(tmp_path):
    raw = yaml.safe_load((ROOT / "router.yaml").read_text())
    raw["prices"] = {"math-model": 1.0, "code-model": 3.0, "general-model": 0.5}
    config = parse_config(raw)
    path = tmp_path / "r.jsonl"
    _write(path, [_row("math", "math-model"), _row("math", "math-model", trace_id="ab" * 16), _row("code", "code-model")])
    records, left_out = read_records(path)
    decisions = [Decision("math", "math-model", 0.9, "matched", 0.8), Decision("code", "code-model", 0.9, "matched", 0.7),
                 Decision("code", "code-model", 0.9, "matched", 0.6)]
    out = report(config, records, decisions, left_out)
    assert out["changed"] == 1 and out["moved"] == [{"from": "math", "to": "code", "requests": 1}]
    assert out["models_before"] == {"code-model": 0.3333, "math-model": 0.6667}
    assert out["models_after"] == {"code-model": 0.6667, "math-model": 0.3333}
    assert (out["cost_before"], out["cost_after"]) == (0.005, 0.007) and out["cost_change"] == 0.4
    assert "math                 code                        1" in format_report(out)
    # The record that moves is named: its line in the file, its trace.
    assert out["moved_records"] == [{"line": 2, "trace_id": "ab" * 16, "from": "math", "to": "code", "reason": "matched"}]
    assert "records that move (line: from -> to): 2: math -> code" in format_report(out)


def test_replay_chooses_the_serving_model_by_the_recorded_facts_as_the_server_does(tmp_path):
    from esr_tuning.decide import decide_requests
    from router.capabilities import REFUSED
    from router.rules import RequestFacts

    config = parse_config({
        "routes": [{"name": "math", "model": "math-model", "utterances": ["m"]},
                   {"name": "ops", "models": ["ops-model", "general-model"], "keywords": ["kubectl"]},
                   {"name": "vision", "model": "vision-model", "keywords": ["diagram"]}],
        "default_route": {"name": "general", "model": "general-model"},
        "capabilities": [{"model": "ops-model", "tools": False}, {"model": "vision-model", "context_tokens": 100},
                         {"model": "general-model", "context_tokens": 100}]})
    path = tmp_path / "r.jsonl"
    _write(path, [{**_row("ops", "ops-model", "keyword"), "texts": ["kubectl logs"],
                   "facts": {"prompt_tokens": 10, "tools": True, "max_tokens": 5, "structured": False, "stream": True}},
                  {**_row("vision", "vision-model", "keyword"), "texts": ["draw a diagram"],
                   "facts": {"prompt_tokens": 10, "max_tokens": 500}}])
    (tools, long), _ = read_records(path)
    assert tools.facts == RequestFacts(10, True, False, 5, False, True)
    decide = decide_requests(config, None, [(r.texts, r.facts) for r in (tools, long)], {})  # keywords decide
    assert (decide[0].route, decide[0].model, decide[0].skipped) == ("ops", "general-model", ("ops-model:tools",))
    assert decide[1].route == REFUSED and decide[1].reason == "no_capable_model"  # the server's 400


def test_the_report_says_what_selection_spends_and_predicts_before_and_after(tmp_path):
    config = parse_config(yaml.safe_load((ROOT / "router.yaml").read_text()))
    path = tmp_path / "r.jsonl"
    _write(path, [_row("math", "math-model", price=10, predicted_quality=0.9),
                  _row("math", "general-model", price=1, predicted_quality=0.7), _row("code", "code-model")])
    records, left_out = read_records(path)
    assert (records[0].price, records[0].predicted_quality, records[2].price) == (10.0, 0.9, None)
    decisions = [Decision("math", "general-model", 0.9, "matched", 0.8, predicted_quality=0.85, price=1.0),
                 Decision("math", "general-model", 0.9, "matched", 0.8, predicted_quality=0.75, price=1.0),
                 Decision("code", "code-model", 0.9, "matched", 0.6)]
    out = report(config, records, decisions, left_out)
    assert (out["selected_spend_before"], out["selected_spend_after"]) == (11.0, 2.0)
    assert (out["selected_quality_before"], out["selected_quality_after"]) == (0.8, 0.8)
    assert "selection: 2 -> 2 requests chosen for, spend 11.0000 -> 2.0000" in format_report(out)
    plain = report(config, records[2:], decisions[2:], left_out)
    assert "selected_spend_before" not in plain and "selection:" not in format_report(plain)
