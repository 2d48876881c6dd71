"""Memory and CPU of a server's whole process tree, read from /proc (Linux; no psutil needed).

A server is a root process and everything it forked (TorchServe: the launcher, the JVM and its
Python workers; Mosec: the Rust front and one process per stage; LitServe: API servers and
inference workers). RSS summed over the tree counts shared pages (torch's libraries) once per
process, as `ps` would; PSS shares them out and is the honest total — both are kept.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        # the command name may hold spaces and parentheses: fields start after the last ')'
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree(root: int) -> list[int]:
    """root and all its descendants that are alive now."""
    kids = _children()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _kb(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def memory_mb(root: int) -> tuple[float, float, int]:
    """(RSS MB, PSS MB, processes) summed over the tree."""
    pids = tree(root)
    rss = sum(_kb(PROC / str(p) / "status", "VmRSS:") for p in pids)
    pss = sum(_kb(PROC / str(p) / "smaps_rollup", "Pss:") for p in pids)
    return rss / 1024.0, pss / 1024.0, len(pids)


def cpu_s(root: int) -> float:
    """User + system CPU seconds of the live processes of the tree (their own, not reaped
    children's: the tree of a server is stable while it serves)."""
    total = 0
    for pid in tree(root):
        try:
            stat = (PROC / str(pid) / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / _TICK


class PeakSampler:
    """Samples the tree's memory every `interval` s in a thread; keeps the peaks."""

    def __init__(self, root: int, interval: float = 0.25) -> None:
        self.root = root
        self.interval = interval
        self.peak_rss_mb = 0.0
        self.peak_pss_mb = 0.0
        self.max_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> tuple[float, float, int]:
        rss, pss, n = memory_mb(self.root)
        self.peak_rss_mb = max(self.peak_rss_mb, rss)
        self.peak_pss_mb = max(self.peak_pss_mb, pss)
        self.max_processes = max(self.max_processes, n)
        return rss, pss, n

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
