"""The pool's /metrics reader against the files its children write (prometheus_client's own format)."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict

from esr_app.pool import ChildSamples


def write_counter(path, value: float) -> None:
    d = MmapedDict(str(path))
    d.write_value(json.dumps(["jobs", "jobs_total", {"process": "worker-0"}, "jobs done"]), value, 0.0)
    d.close()


def test_a_scrape_while_a_child_is_creating_its_file_still_answers(tmp_path):
    write_counter(tmp_path / "counter_100.db", 3.0)
    (tmp_path / "counter_101.db").touch()  # a restarted child has opened its file, not sized it yet
    registry = CollectorRegistry()
    ChildSamples(registry, path=str(tmp_path))
    text = generate_latest(registry).decode()
    assert 'jobs_total{process="worker-0"} 3.0' in text
    write_counter(tmp_path / "counter_101.db", 4.0)  # once it has samples, they count
    assert 'jobs_total{process="worker-0"} 7.0' in generate_latest(registry).decode()
