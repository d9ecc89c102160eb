"""The batcher's per-request histograms, counted a batch at a time, read as one observe per request."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Histogram

from esr_app.metrics import observe_many


def _samples(histogram: Histogram) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for metric in histogram.collect() for s in metric.samples if not s.name.endswith("_created")}


def test_a_batch_of_waits_counts_as_each_wait_observed_alone():
    buckets = (0.001, 0.005, 0.01, 0.1, 1.0)
    alone = Histogram("alone", "x", buckets=buckets, registry=CollectorRegistry())
    together = Histogram("together", "x", buckets=buckets, registry=CollectorRegistry())
    waits = [0.0, 0.001, 0.0010001, 0.004, 0.005, 0.2, 1.0, 7.5] + list(np.random.default_rng(0).exponential(0.01, 200))
    for w in waits:
        alone.observe(w)
    observe_many(together, waits[:100])
    observe_many(together, waits[100:])
    observe_many(together, [])
    got = {(n.replace("together", "alone"), labels): v for (n, labels), v in _samples(together).items()}
    want = _samples(alone)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == value if not key[0].endswith("_sum") else abs(got[key] - value) < 1e-9, key
