"""Ansible callback shipped in the node bundle: the node agent learns from it which task a
bootstrap play is on and which one failed, without parsing Ansible's output.

Enabled by the agent (ANSIBLE_CALLBACKS_ENABLED=torchfleet_status); writes the JSON file named
by TORCHFLEET_STATUS_FILE after every event: {"task", "failed": {"task", "msg"}, "stats"}.
Runs on every ansible-core the bootstrap venv pins (2.15 to 2.19)."""

from __future__ import annotations

import json
import os
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: torchfleet_status
    type: notification
    short_description: write the current and failed task of a play to a JSON file
    description: Used by the torchfleet node agent (infra/bootstrap/torchfleet_agent/playbook.py).
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "torchfleet_status"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._path = os.environ.get("TORCHFLEET_STATUS_FILE")
        self._doc: dict[str, Any] = {"task": None, "failed": None, "stats": None}

    def _write(self) -> None:
        if not self._path:
            return
        tmp = self._path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self._doc, f, indent=2, sort_keys=True)
        os.replace(tmp, self._path)

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._doc["task"] = task.get_name()
        self._write()

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self._doc["task"] = task.get_name()
        self._write()

    def _failed(self, result: Any, what: str) -> None:
        res = result._result
        msg = res.get("msg") or res.get("stderr") or res.get("reason") or what
        self._doc["failed"] = {"task": result._task.get_name(), "msg": str(msg)[:2000]}
        self._write()

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if not ignore_errors:
            self._failed(result, "failed")

    def v2_runner_on_unreachable(self, result: Any) -> None:
        self._failed(result, "unreachable")

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._doc["stats"] = {host: stats.summarize(host) for host in sorted(stats.processed)}
        self._write()
