"""The stack's rollout record: one JSON file beside the stack's other local state.

Contract. `RolloutState(path)`: `read()` the record (an empty one when none exists), `write(doc)`
atomically (a reader never sees half a file), `update(fn)` read-modify-write under an exclusive
lock (the engine and `rollout pause|resume|abort` from another terminal write the same file).
The record: `stable` and `previous` (the version before the last promotion) and `candidate`,
each {sha256, file, version}; `status` (idle, running, paused, promoted, rolled_back, aborted);
`strategy`, `steps`, `step`, `share`; `guards`; `timeline` (one entry per decision: time, step,
share, decision, guard, reason, numbers); `control` (pause, resume or abort: asked of the engine,
which clears it); `pid` of the engine running it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ACTIVE = ("running", "paused")


def empty() -> dict[str, Any]:
    return {
        "status": "idle",
        "stable": None,
        "previous": None,
        "candidate": None,
        "timeline": [],
        "control": None,
    }


class RolloutState:
    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def read(self) -> dict[str, Any]:
        try:
            return {**empty(), **json.loads(self.path.read_text())}
        except FileNotFoundError:
            return empty()

    def write(self, doc: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)

    def update(self, fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        with self._locked():
            doc = self.read()
            fn(doc)
            self.write(doc)
            return doc


def engine_alive(doc: dict[str, Any]) -> bool:
    """Whether the engine that recorded itself in `doc` still runs (on this machine)."""
    pid = doc.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
