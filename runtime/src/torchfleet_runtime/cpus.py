"""How many CPUs this process may really use: the affinity mask and the cgroup CPU quota.

torch sizes its intra-op pool by the CPUs the kernel reports, which inside a container with a
CPU limit (`podman run --cpus 2`, a Kubernetes `limits.cpu`) are the host's: 64 OpenMP threads
sharing a 2-CPU quota are throttled in every scheduling period. `usable_cpus()` is the smallest of
- the affinity mask (`os.sched_getaffinity`: taskset, cpusets, `--cpuset-cpus`), else os.cpu_count();
- every CPU quota on the way from this process's cgroup up to its hierarchy's root (a quota on a
  parent slice limits its children too): cgroup v2 `cpu.max` ("QUOTA PERIOD" or "max PERIOD"),
  cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: none). Hybrid hosts have both
  hierarchies; each one found counts.
A quota of Q/P CPUs gives floor(Q/P) threads, at least 1: a thread more than the quota only
buys throttling, and the HTTP thread needs the remainder. The cgroup files are located through
/proc/self/cgroup and /proc/self/mountinfo (a container's cgroup namespace, or none, both
resolve). Standard library only, Python 3.8; anything unreadable counts as "no limit", never as
an error.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterator

__all__ = ["cgroup_cpu_limit", "usable_cpus"]


def _affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _mounts(mountinfo: str) -> Iterator[tuple[str, str, str, list[str]]]:
    """(root, mount point, fs type, super options) of each line of /proc/self/mountinfo."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        # the kernel escapes spaces in paths as \040
        root, point = (f.replace("\\040", " ") for f in fields[3:5])
        yield root, point, tail[0], tail[2].split(",")


def _cgroup_dirs(proc: Path) -> Iterator[tuple[str, Path, Path]]:
    """("v1" | "v2", this process's cgroup directory, its mount point) for each hierarchy with a
    CPU controller (v1) and for the unified one (v2)."""
    cgroups, mountinfo = _read(proc / "cgroup"), _read(proc / "mountinfo")
    if cgroups is None or mountinfo is None:
        return
    mounts = list(_mounts(mountinfo))
    for line in cgroups.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            kind = "v2"
            found = [(r, p) for r, p, fs, _ in mounts if fs == "cgroup2"]
        elif "cpu" in controllers.split(","):
            kind = "v1"
            found = [(r, p) for r, p, fs, opts in mounts if fs == "cgroup" and "cpu" in opts]
        else:
            continue
        for root, point in found:
            mount = Path(point)
            # The path is relative to the hierarchy's root; the mount may show a sub-tree of it
            # (a container's own cgroup). Without a cgroup namespace the path names host
            # directories the container cannot see: its own cgroup is then the mount itself.
            rel = (
                path[len(root) :]
                if root != "/" and (path == root or path.startswith(root + "/"))
                else path
            )
            here = mount / rel.lstrip("/")
            yield kind, (here if here.is_dir() else mount), mount


def _quota(kind: str, directory: Path) -> float | None:
    """CPUs granted by the quota of this one cgroup directory, or None (none set, unreadable)."""
    try:
        if kind == "v2":
            text = _read(directory / "cpu.max")
            if text is None:
                return None
            quota, _, period = text.strip().partition(" ")
            if quota == "max":
                return None
            q, p = int(quota), int(period or "100000")
        else:
            q_text, p_text = (
                _read(directory / "cpu.cfs_quota_us"),
                _read(directory / "cpu.cfs_period_us"),
            )
            if q_text is None or p_text is None:
                return None
            q, p = int(q_text.strip()), int(p_text.strip())
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpu_limit(proc: str = "/proc/self") -> float | None:
    """The tightest CPU quota over this process's cgroups and their ancestors, in CPUs (may be
    fractional), or None when no quota applies."""
    limits: list[float] = []
    for kind, directory, mount in _cgroup_dirs(Path(proc)):
        d = directory
        while True:
            q = _quota(kind, d)
            if q is not None:
                limits.append(q)
            if d == mount or mount not in d.parents:
                break
            d = d.parent
    return min(limits) if limits else None


def usable_cpus(proc: str = "/proc/self", affinity: int | None = None) -> int:
    """CPUs this process may use: min(affinity mask, floor(cgroup quota)), at least 1."""
    cpus = _affinity_cpus() if affinity is None else affinity
    limit = cgroup_cpu_limit(proc)
    if limit is not None:
        cpus = min(cpus, max(1, math.floor(limit)))
    return max(1, cpus)
