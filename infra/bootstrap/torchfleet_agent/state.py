"""The state file (/var/lib/torchfleet/bootstrap.json): what the node is doing, for people and
for the next boot. "state" is running | warmed | ready | failed (| terminating); "stage" the step
it is on or failed in; "stages" the seconds from this bootstrap's start to each step."""

from __future__ import annotations

import time
from typing import Any

from . import boot


class State:
    def __init__(self) -> None:
        self.doc: dict[str, Any] = boot.read_json(boot.STATE, {}) or {}

    def __getitem__(self, key: str) -> Any:
        return self.doc.get(key)

    def update(self, **fields: Any) -> None:
        self.doc.update(fields)
        boot.write_json(boot.STATE, self.doc)

    def stage(self, name: str) -> None:
        boot.log("stage " + name)
        stages = self.doc.setdefault("stages", {})
        stages[name] = round(time.time() - self.doc.get("started_epoch", time.time()), 1)
        self.update(stage=name)
