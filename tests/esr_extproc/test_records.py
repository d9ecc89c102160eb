"""Decision records: sampled, rate-limited, written whole, texts only when asked for."""

from __future__ import annotations

import json

import pytest

from esr_extproc.records import FIELD_MAX, LINE_MAX, DecisionRecorder, RecordsConfig
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


def test_a_record_with_bytes_no_encoder_takes_costs_only_its_own_line(tmp_path):
    """A lone surrogate (a client's JSON may escape one into any string), control characters and
    huge values: the writer keeps writing, each value escaped or cut, every line JSON."""
    path = tmp_path / "records.jsonl"
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path), prompts=True, prompt_max_chars=10**6))
    recorder.record({"requested_model": "gpt\ud800-4", "path": "/v1/\x00\x1b[31m"}, texts=("hi \udfff there",))
    recorder.record({"requested_model": "m" * 10**6, "n": 1}, texts=("x" * (LINE_MAX * 2),))
    recorder.record({"route": "math", "n": 2}, texts=("fine",))
    recorder.close()
    first, huge, last = _lines(path)
    assert first["requested_model"] == "gpt\ud800-4" and first["texts"] == ["hi \udfff there"]  # read back as sent
    assert first["path"] == "/v1/\x00\x1b[31m"
    assert huge["requested_model"] == "m" * FIELD_MAX and huge["cut"] == "texts" and "texts" not in huge
    assert all(len(line) <= LINE_MAX for line in path.read_bytes().splitlines(keepends=True))
    assert last == {**last, "route": "math", "n": 2, "texts": ["fine"]}


def test_a_value_the_encoder_cannot_take_loses_one_record_not_the_writer(tmp_path):
    path = tmp_path / "records.jsonl"
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path)))
    recorder.record({"n": 0, "bad": object()})  # not JSON at all
    recorder.record({"n": 1})
    recorder.close()
    assert [line["n"] for line in _lines(path)] == [1]


@pytest.mark.parametrize("key,value", [("sample_ratio", 1.5), ("max_per_s", 0), ("prompt_max_chars", 0), ("path", "")])
def test_bad_settings_name_their_key(key, value):
    with pytest.raises(SettingError) as raised:
        RecordsConfig(**{key: value})
    assert raised.value.field == key


def test_a_file_past_its_size_is_moved_to_dot_one_and_at_most_two_files_are_kept(tmp_path):
    path = tmp_path / "records.jsonl"
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path), prompts=True, max_bytes=400), look_s=0)
    for i in range(30):
        recorder.record({"route": "math", "n": i}, texts=("solve 2x = 4",))
    recorder.close()
    current, before = _lines(path), _lines(tmp_path / "records.jsonl.1")
    assert path.stat().st_size < 400 + 200 and (tmp_path / "records.jsonl.1").stat().st_size >= 400
    assert current[-1]["n"] == 29 and [r["n"] for r in before + current] == list(range(before[0]["n"], 30))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.jsonl", "records.jsonl.1", "records.jsonl.lock"]
    assert (tmp_path / "records.jsonl.lock").stat().st_size == 0  # the pool's rotation lock holds no record
    assert path.stat().st_mode & 0o777 == 0o640  # the texts: owner and group only


def test_a_file_taken_away_for_a_refit_is_followed_by_a_new_one(tmp_path):
    path = tmp_path / "records.jsonl"
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path)), look_s=0)
    recorder.record({"n": 0})
    recorder.record({"n": 1})
    recorder.close(timeout=5)  # the queue is written; a new recorder goes on where a pool's would
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path)), look_s=0)
    recorder.record({"n": 2})
    import time
    deadline = time.monotonic() + 5
    while not path.exists() or len(_lines(path)) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    taken = tmp_path / "taken.jsonl"
    path.rename(taken)  # what the refit job does
    recorder.record({"n": 3})
    recorder.close()
    assert [r["n"] for r in _lines(taken)] == [0, 1, 2] and [r["n"] for r in _lines(path)] == [3]


def test_a_file_whose_first_record_is_past_its_age_is_moved(tmp_path):
    import time

    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"time": time.time() - 100, "n": -1}) + "\n")
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path), max_age_s=50), look_s=0)
    recorder.record({"n": 0})
    recorder.record({"n": 1})
    recorder.close()
    assert [r["n"] for r in _lines(tmp_path / "records.jsonl.1")] == [-1, 0] and [r["n"] for r in _lines(path)] == [1]


def test_a_bound_needs_a_file_and_a_bad_one_is_named():
    from esr_config import ConfigError, parse_config

    base = {"routes": [{"name": "math", "model": "m", "utterances": ["x"]}], "default_route": {"name": "g", "model": "g"}}
    with pytest.raises(ConfigError, match="records.max_bytes"):
        parse_config({**base, "records": {"enabled": True, "path": "-", "max_bytes": 1000}})
    with pytest.raises(ConfigError, match="records.max_age_s"):
        parse_config({**base, "records": {"enabled": True, "path": "x", "max_age_s": -1}})


def test_host_in_the_path_gives_each_replica_a_file_of_its_own(tmp_path):
    import socket

    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(tmp_path / "{host}.jsonl")))
    recorder.record({"n": 0})
    recorder.close()
    assert [r["n"] for r in _lines(tmp_path / f"{socket.gethostname()}.jsonl")] == [0]


def test_an_idle_writer_still_moves_an_old_file_and_deletes_an_older_one(tmp_path):
    import os
    import time

    path = tmp_path / "records.jsonl"
    older = tmp_path / "records.jsonl.1"
    older.write_text(json.dumps({"time": time.time() - 100, "n": -2}) + "\n")
    os.utime(older, (time.time() - 100, time.time() - 100))
    path.write_text(json.dumps({"time": time.time() - 100, "n": -1}) + "\n")
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path), max_age_s=50), look_s=0.05)
    recorder.record({"n": 0})  # opens the file; then no traffic at all
    deadline = time.monotonic() + 5
    while path.exists() or not older.exists() or [r["n"] for r in _lines(older)] != [-1, 0]:
        assert time.monotonic() < deadline, "an idle writer kept a file past its age"
        time.sleep(0.02)
    recorder.close()


def test_a_moved_file_older_than_the_bound_is_deleted(tmp_path):
    import os
    import time

    path, older = tmp_path / "records.jsonl", tmp_path / "records.jsonl.1"
    older.write_text(json.dumps({"time": time.time() - 100, "n": -1}) + "\n")
    os.utime(older, (time.time() - 100, time.time() - 100))
    recorder = DecisionRecorder(RecordsConfig(enabled=True, path=str(path), max_age_s=50), look_s=0.05)
    recorder.record({"n": 0})
    deadline = time.monotonic() + 5
    while older.exists():
        assert time.monotonic() < deadline, "a .1 past the age bound was kept"
        time.sleep(0.02)
    recorder.close()
    assert [r["n"] for r in _lines(path)] == [0]
