"""How many CPUs this process may really use: its affinity mask and every CFS quota above it.

`os.cpu_count()` and the affinity mask both ignore CFS quotas, so a container limited to 4 CPUs on a
64-core node would otherwise start 64 model threads that take turns inside a 4-CPU budget, each
descheduled in the middle of a parallel region while the others spin at its barrier.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuBudget:
    affinity: int  # CPUs in the scheduler's affinity mask
    quota: float | None  # CPUs' worth of CFS quota (smallest along the cgroup path); None: unlimited
    source: str  # where `cpus` came from: affinity | cgroup_v1 | cgroup_v2

    @property
    def cpus(self) -> int:
        """Whole CPUs the process can keep busy: a fractional quota rounds up (a 1.5-CPU quota
        still runs two threads at once for part of each period), never above the affinity mask."""
        if self.quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.ceil(self.quota - 1e-9)))


def detect(proc: Path = Path("/proc/self"), root: Path = Path("/")) -> CpuBudget:
    """The budget of the calling process; `proc` and `root` let tests hand in a fake filesystem."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quotas: list[tuple[float, str]] = []
    try:
        cgroups = (proc / "cgroup").read_text()
        mounts = (proc / "mountinfo").read_text()
    except OSError:  # not Linux, or no /proc: the affinity mask is all we know
        return CpuBudget(affinity, None, "affinity")
    for version, directory in _cpu_cgroup_dirs(cgroups, mounts, root):
        q = _quota_along(directory, version)
        if q is not None:
            quotas.append((q, f"cgroup_{version}"))
    if not quotas:
        return CpuBudget(affinity, None, "affinity")
    quota, source = min(quotas)
    budget = CpuBudget(affinity, quota, source)
    return budget if budget.cpus < affinity else CpuBudget(affinity, quota, "affinity")


def _cpu_cgroup_dirs(cgroups: str, mountinfo: str, root: Path) -> list[tuple[str, Path]]:
    """(version, directory of this process's cgroup) for the v1 `cpu` controller and for v2."""
    mounts: list[tuple[str, str, str, set[str]]] = []  # (fstype, mount root, mount point, options)
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        mounts.append((rest[0], fields[3], fields[4], set(rest[2].split(","))))
    found = []
    for line in cgroups.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            candidates = [m for m in mounts if m[0] == "cgroup2"]
            version = "v2"
        elif "cpu" in controllers.split(","):
            candidates = [m for m in mounts if m[0] == "cgroup" and "cpu" in m[3]]
            version = "v1"
        else:
            continue
        for _, mount_root, mount_point, _ in candidates:
            # Inside a cgroup namespace the path is relative to the mount's root already.
            rel = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path.lstrip("/")
            directory = root / mount_point.lstrip("/") / ("" if rel == "." else rel)
            if directory.is_dir():
                found.append((version, directory))
                break
    return found


def _quota_along(directory: Path, version: str) -> float | None:
    """The smallest quota (in CPUs) set on this cgroup or any ancestor visible in the mount."""
    best: float | None = None
    d = directory
    while True:
        q = _quota_v2(d) if version == "v2" else _quota_v1(d)
        if q is not None:
            best = q if best is None else min(best, q)
        if not (d.parent / ("cpu.max" if version == "v2" else "cpu.cfs_quota_us")).exists() or d.parent == d:
            return best
        d = d.parent


def _quota_v1(d: Path) -> float | None:
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text())
        period = int((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _quota_v2(d: Path) -> float | None:
    try:
        limit, _, period = (d / "cpu.max").read_text().partition(" ")
    except OSError:
        return None
    if limit.strip() == "max":
        return None
    try:
        return int(limit) / int(period or 100000)
    except ValueError:
        return None
