"""Decision records: sampled, rate-limited, written whole, texts only when asked for."""

from __future__ import annotations

import json

import pytest

from esr_extproc.records import DecisionRecorder, RecordsConfig, trace_id
from esr_settings import SettingError


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_are_written_one_line_each_without_texts_unless_asked(tmp_path):
    path = tmp_path / "records.jsonl"
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path)))
    for i in range(3):
        assert recorder.wants()
        recorder.record({"route": "math", "n": i}, texts=("solve 2x = 4",))
    recorder.close()
    lines = _lines(path)
    assert [line["n"] for line in lines] == [0, 1, 2]
    assert all("texts" not in line and line["time"] > 0 for line in lines)


def test_texts_are_kept_when_asked_for_and_cut_to_the_limit(tmp_path):
    path = tmp_path / "records.jsonl"
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path), prompts=True, prompt_max_chars=5))
    recorder.record({"route": "math"}, texts=("solve 2x = 4", "ok"))
    recorder.close()
    assert _lines(path)[0]["texts"] == ["solve", "ok"]


def test_sampling_and_the_rate_limit_bound_what_is_recorded(tmp_path):
    draws = iter([0.05, 0.5, 0.09, 0.95])
    sampled = DecisionRecorder(RecordsConfig(enabled=True, path=str(tmp_path / "a"), sample_ratio=0.1),
                               draw=lambda: next(draws))
    assert [sampled.wants() for _ in range(4)] == [True, False, True, False]
    limited = DecisionRecorder(RecordsConfig(enabled=True, path=str(tmp_path / "b"), max_per_s=3))
    assert sum(limited.wants() for _ in range(100)) <= 4  # a second's worth, plus what refills meanwhile
    sampled.close()
    limited.close()


def test_trace_ids_come_from_well_formed_traceparents_only():
    assert trace_id({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}) == \
        "4bf92f3577b34da6a3ce929d0e0e4736"
    for bad in ("", "00-xyz-00f067aa0ba902b7-01", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "garbage"):
        assert trace_id({"traceparent": bad}) is None


@pytest.mark.parametrize("key,value", [("sample_ratio", 1.5), ("max_per_s", 0), ("prompt_max_chars", 0), ("path", "")])
def test_bad_settings_name_their_key(key, value):
    with pytest.raises(SettingError) as raised:
        RecordsConfig(**{key: value})
    assert raised.value.field == key
