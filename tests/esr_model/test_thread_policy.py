"""The CPU budget (affinity and CFS quotas) and the thread tuner that picks the model's torch threads."""

from __future__ import annotations

import os
from pathlib import Path

from batching.cost_model import CALIBRATED_SHARE, BatchCostModel
from esr_model.cpu_quota import CpuBudget, detect
from esr_model.thread_policy import ThreadTuner, candidates

AFFINITY = len(os.sched_getaffinity(0))


def fake_proc(tmp: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


def write(path: Path, **files: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name.replace("_", ".", 1) if name.startswith("cpu_") else path / name).write_text(text)


V1_MOUNT = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
V2_MOUNT = "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n"


def test_v1_quota_of_the_process_cgroup_and_its_parent_smallest_wins(tmp_path):
    base = tmp_path / "sys/fs/cgroup/cpu"
    write(base, **{"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"})
    write(base / "kubepods", **{"cpu.cfs_quota_us": "150000", "cpu.cfs_period_us": "100000"})
    write(base / "kubepods/pod1", **{"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"})
    proc = fake_proc(tmp_path, "3:cpu,cpuacct:/kubepods/pod1\n", V1_MOUNT)
    b = detect(proc, tmp_path)
    assert b.quota == 1.5 and b.source == ("cgroup_v1" if AFFINITY > 2 else "affinity")
    assert b.cpus == min(AFFINITY, 2)  # 1.5 CPUs run two threads part of each period


def test_v2_cpu_max_and_unlimited(tmp_path):
    write(tmp_path / "sys/fs/cgroup/app", **{"cpu.max": "100000 100000\n"})
    (tmp_path / "sys/fs/cgroup/cpu.max").write_text("max 100000\n")
    proc = fake_proc(tmp_path, "0::/app\n", V2_MOUNT)
    b = detect(proc, tmp_path)
    assert b.quota == 1.0 and b.cpus == 1
    assert b.source == ("cgroup_v2" if AFFINITY > 1 else "affinity")
    (tmp_path / "sys/fs/cgroup/app/cpu.max").write_text("max 100000\n")
    assert detect(proc, tmp_path) == CpuBudget(AFFINITY, None, "affinity")


def test_no_cgroup_files_falls_back_to_the_affinity_mask(tmp_path):
    assert detect(tmp_path / "missing", tmp_path).cpus == AFFINITY
    assert CpuBudget(64, 4.0, "cgroup_v1").cpus == 4
    assert CpuBudget(2, 0.2, "cgroup_v1").cpus == 1


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run(tuner: ThreadTuner, clock: Clock, seconds_per_token: dict[int, float], batches: int) -> list[int]:
    """Batch sizes depend on the count in use, as under load (fewer threads, bigger batches); an
    exploring batch has the shape the current count would have run."""
    chosen = []
    for i in range(batches):
        padded = (100 if tuner.current == tuner.candidates[0] else 400) + 10 * (i % 5)
        n = tuner.choose()
        tuner.record(n, padded, 0.005 + seconds_per_token[n] * padded)
        clock.t += 0.05
        chosen.append(n)
    return chosen


def test_tuner_follows_contention_both_ways():
    assert candidates(2) == [2, 1] and candidates(16) == [16, 8, 1] and candidates(1) == [1]
    clock = Clock()
    tuner = ThreadTuner(2, clock=clock)
    # A quiet machine: two threads are faster, and stay chosen between explorations.
    quiet = run(tuner, clock, {2: 1e-4, 1: 1.8e-4}, 200)
    assert tuner.current == 2 and quiet[-100:].count(2) >= 95
    # A neighbour arrives: two threads stall at every barrier; the tuner moves to one at once
    # (the slowdown itself triggers a look), not at its next scheduled one.
    busy = run(tuner, clock, {2: 5e-4, 1: 2e-4}, 200)
    assert tuner.current == 1 and busy[:10].count(1) >= 5 and busy[-100:].count(1) >= 95
    # It leaves: re-measuring (every 2 s at most) finds two threads faster again within 5 s.
    back = run(tuner, clock, {2: 1e-4, 1: 1.8e-4}, 200)
    assert tuner.current == 2 and back[100:].count(2) >= 95


def test_cost_model_learns_fixed_and_per_token_parts():
    m = BatchCostModel()
    assert not m.ready and m.predict(100) == 0.0 and m.max_tokens_within(0.1) == float("inf")
    for tokens in (10, 100, 400, 50, 800, 200):
        m.observe(tokens, 0.005 + 0.0002 * tokens)
    fixed, per_token = m.coefficients
    assert abs(fixed - 0.005) < 1e-6 and abs(per_token - 0.0002) < 1e-8
    assert abs(m.predict(1000) - 0.205) < 1e-6
    assert abs(m.max_tokens_within(0.105) - 500) < 1e-3
    # The machine slows down: recent batches outweigh old ones.
    for _ in range(40):
        m.observe(100, 0.1)
        m.observe(300, 0.3)
    assert abs(m.predict(200) - 0.2) < 0.01


def test_cost_model_with_one_batch_shape_errs_high_not_low():
    m = BatchCostModel()
    for _ in range(5):
        m.observe(12, 0.008)  # an idle router sees singles only
    assert m.predict(12) == 0.008 or abs(m.predict(12) - 0.008) < 1e-9
    assert m.predict(768) >= 0.008 * 64 * 0.99  # proportional: never below what a bigger batch costs


def test_a_calibrated_cost_model_extrapolates_one_batch_shape_by_the_calibrated_split():
    # Warm singles of 16 and 256 tokens: 6.6 ms fixed, 0.18 ms a token (what the bundled model
    # measured here). Traffic then shows only 12-token singles, at whatever level the load sets.
    m = BatchCostModel()
    m.calibrate([(16, 0.0066 + 16 * 0.00018), (256, 0.0066 + 256 * 0.00018)])
    overhead = CALIBRATED_SHARE * 0.0066 / 0.00018  # the fixed part kept, in tokens' worth
    for _ in range(5):
        m.observe(12, 0.015)  # a neighbour slows everything by about 1.7x
    assert abs(m.predict(12) - 0.015) < 1e-9  # the level is the traffic's
    expected = 0.015 * (256 + overhead) / (12 + overhead)
    assert abs(m.predict(256) - expected) < 1e-9
    assert m.predict(256) < 0.015 * 256 / 12 / 2  # the uncalibrated guess was over twice this
    # Traffic of several sizes still speaks for itself.
    for tokens in (10, 100, 400, 50, 800, 200):
        m.observe(tokens, 0.005 + 0.0002 * tokens)
    assert abs(m.predict(1000) - 0.205) < 0.01


def test_calibration_that_shows_no_split_is_ignored():
    m = BatchCostModel()
    m.calibrate([(16, 0.01)])  # one size
    m.calibrate([(16, 0.02), (256, 0.01)])  # longer cheaper: noise, not a split
    for _ in range(5):
        m.observe(12, 0.008)
    assert m.predict(768) >= 0.008 * 64 * 0.99  # as uncalibrated: errs high


def test_calibrating_after_traffic_takes_effect_at_once():
    m = BatchCostModel()
    for _ in range(5):
        m.observe(12, 0.008)
    before = m.predict(256)
    m.calibrate([(16, 0.0096), (256, 0.0528)])
    assert m.predict(256) < before / 2 and abs(m.predict(12) - 0.008) < 1e-9


def test_a_front_end_that_works_beside_the_model_keeps_a_cpu_from_its_threads():
    from esr_model.thread_policy import model_cpus

    assert model_cpus(2, 1) == 1 and model_cpus(8, 1) == 7
    assert model_cpus(1, 1) == 1  # never none
    assert model_cpus(4) == 4
