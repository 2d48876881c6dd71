"""Progress display: stage headers, Pulumi engine events, Ansible's per-host event stream.

`Console` prints to a stream (and copies every line to the run log). On a terminal the
per-host display is a live block, one line per host redrawn in place; elsewhere (CI, a pipe) it
prints a line when a host enters a role, when a task took long, and when a task failed, so a
log shows where the time went without Ansible's full output. `-v` adds that full output.

`EngineProgress.on_event` takes `pulumi.automation.EngineEvent`s (what `Stack.up(on_event=)`
delivers); `HostProgress.on_event` takes ansible-runner event dicts (`event_handler=`). Both
keep what the caller needs afterwards: the failures (resource or host + task + message) and the
counts."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

SLOW_TASK_S = 10.0  # non-terminal output: tasks that took at least this long get a line
_OPS = {
    "create": "+",
    "update": "~",
    "delete": "-",
    "replace": "+-",
    "create-replacement": "++",
    "delete-replaced": "--",
    "read": ">",
    "refresh": "~",
    "import": "=",
}
_DONE = {
    "create": "created",
    "update": "updated",
    "delete": "deleted",
    "replace": "replaced",
    "create-replacement": "created replacement",
    "delete-replaced": "deleted replaced",
    "read": "read",
    "refresh": "refreshed",
    "import": "imported",
}


def shown(path: Path | str) -> str:
    """A path as the user typed it from the repository root (absolute when outside it)."""
    from infra.matrix import REPO_ROOT

    path = Path(path)
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs:02d} s"


class Console:
    def __init__(
        self, stream: IO[str] | None = None, verbose: bool = False, live: bool | None = None
    ) -> None:
        self.stream = stream or sys.stdout
        self.verbose = verbose
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.live = isatty and os.environ.get("TERM") != "dumb" if live is None else live
        self.log: IO[str] | None = None
        self._lock = threading.RLock()
        self._block: list[str] = []
        self._drawn = 0

    def open_log(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.log = path.open("a")

    def close(self) -> None:
        self.end_block()
        if self.log:
            self.log.close()
            self.log = None

    # -- plain lines ------------------------------------------------------------------------
    def line(self, text: str = "") -> None:
        with self._lock:
            self._clear_block()
            self.stream.write(text + "\n")
            self._draw_block()
            self.stream.flush()
            self.to_log(text)

    def detail(self, text: str) -> None:
        """Only with -v on screen; always in the run log."""
        if self.verbose:
            self.line(text)
        else:
            self.to_log(text)

    def to_log(self, text: str) -> None:
        if self.log:
            self.log.write(text + "\n")
            self.log.flush()

    @contextlib.contextmanager
    def stage(self, number: int, total: int, name: str, title: str) -> Iterator[None]:
        started = time.monotonic()
        self.line(f"[{number}/{total}] {name}: {title}")
        try:
            yield
        except BaseException:
            self.end_block()
            self.line(f"      {name} stopped after {_duration(time.monotonic() - started)}")
            raise
        self.end_block()
        self.line(f"      {name} done in {_duration(time.monotonic() - started)}")

    # -- live block (terminal only) ---------------------------------------------------------
    def set_block(self, lines: list[str]) -> None:
        if not self.live:
            return
        with self._lock:
            self._clear_block()
            self._block = lines
            self._draw_block()
            self.stream.flush()

    def end_block(self) -> None:
        """Leave the block's last state on screen and stop redrawing it."""
        with self._lock:
            self._drawn = 0
            self._block = []

    def _clear_block(self) -> None:
        if self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0

    def _draw_block(self) -> None:
        width = shutil.get_terminal_size((120, 20)).columns - 1
        for text in self._block:
            self.stream.write(text[:width] + "\n")
        self._drawn = len(self._block)


# -- Pulumi engine events ---------------------------------------------------------------------


def urn_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1] if urn else "?"


@dataclass
class ResourceFailure:
    urn: str
    type: str
    message: str


@dataclass
class EngineProgress:
    """Renders `pulumi.automation` engine events as one line per finished resource step."""

    console: Console
    started: dict[str, float] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    unchanged: int = 0
    failures: list[ResourceFailure] = field(default_factory=list)
    diagnostics: list[str] = field(default_factory=list)
    summary: dict[str, int] | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        # the Automation API may deliver events from its gRPC server's worker threads
        self._lock = threading.Lock()

    def on_event(self, event: Any) -> None:
        with self._lock:
            self._on_event(event)

    def _on_event(self, event: Any) -> None:
        if event.diagnostic_event is not None:
            self._diagnostic(event.diagnostic_event)
        elif event.resource_pre_event is not None:
            meta = event.resource_pre_event.metadata
            if self._shown(meta):
                self.started[meta.urn] = time.monotonic()
                self.console.detail(
                    f"  {_OPS.get(meta.op.value, '?'):>2} {meta.op.value:<8} "
                    f"{meta.type}  {urn_name(meta.urn)}"
                )
            elif meta.op.value == "same" and not meta.type.startswith("pulumi:"):
                self.unchanged += 1
        elif event.res_outputs_event is not None:
            meta = event.res_outputs_event.metadata
            if self._shown(meta):
                took = time.monotonic() - self.started.pop(meta.urn, time.monotonic())
                op = meta.op.value
                self.done[op] = self.done.get(op, 0) + 1
                self.console.line(
                    f"  {_OPS.get(op, '?'):>2} {_DONE.get(op, op):<8} {meta.type}  "
                    f"{urn_name(meta.urn)}  ({_duration(took)})"
                )
        elif event.res_op_failed_event is not None:
            meta = event.res_op_failed_event.metadata
            self.started.pop(meta.urn, None)
            message = next(
                (d for d in reversed(self.diagnostics) if d.startswith(urn_name(meta.urn) + ":")),
                "see the errors above",
            )
            self.failures.append(ResourceFailure(meta.urn, meta.type, message))
            self.console.line(f"  !! failed   {meta.type}  {urn_name(meta.urn)}")
        elif event.summary_event is not None:
            s = event.summary_event
            self.summary = {
                str(getattr(k, "value", k)): int(v) for k, v in (s.resource_changes or {}).items()
            }
            self.duration_s = s.duration_seconds
        elif getattr(event, "policy_event", None) is not None:
            p = event.policy_event
            self.console.line(
                f"  policy {p.policy_pack_name}/{p.policy_name} "
                f"({p.enforcement_level}): {p.description}"
            )
        self._live()

    def _shown(self, meta: Any) -> bool:
        # the stack itself is not a step worth a line; unchanged resources are counted only
        return meta.op.value != "same" and meta.type != "pulumi:pulumi:Stack"

    def _diagnostic(self, d: Any) -> None:
        if d.ephemeral:
            return
        text = (d.message or "").strip()
        if not text:
            return
        who = urn_name(d.urn) if d.urn else "pulumi"
        if d.severity == "error":
            self.diagnostics.append(f"{who}: {text}")
            self.console.line(f"  error  {who}: {text}")
        elif d.severity == "warning":
            self.console.line(f"  warning  {who}: {text}")
        else:
            self.console.detail(f"  {who}: {text}")

    def _live(self) -> None:
        if self.started:
            names = ", ".join(urn_name(u) for u in list(self.started)[:4])
            more = f" and {len(self.started) - 4} more" if len(self.started) > 4 else ""
            self.console.set_block([f"  in flight ({len(self.started)}): {names}{more}"])
        else:
            self.console.set_block([])

    def totals(self) -> str:
        counts = self.summary or {**self.done, "same": self.unchanged}
        parts = [
            f"{n} {_DONE.get(op, 'unchanged' if op == 'same' else op)}"
            for op, n in sorted(counts.items())
            if n
        ]
        took = f" in {_duration(self.duration_s)}" if self.duration_s is not None else ""
        return (", ".join(parts) or "no changes") + took


# -- Ansible (ansible-runner) events ----------------------------------------------------------


@dataclass
class HostState:
    name: str
    task: str = "waiting"
    role: str | None = None
    task_started: float = 0.0
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: bool = False

    def line(self, width: int, now: float) -> str:
        state = (
            "UNREACHABLE"
            if self.unreachable
            else (f"ok={self.ok} changed={self.changed} failed={self.failed}")
        )
        task = f"[{self.role}] {self.task}" if self.role else self.task
        running = f" {int(now - self.task_started)}s" if self.task_started else ""
        return f"  {self.name:<{width}}  {state:<28} {task}{running}"


@dataclass
class HostFailure:
    host: str
    task: str
    message: str


def _result_message(res: dict[str, Any]) -> str:
    """The useful part of a failed task's result: its msg, then the tail of stderr/stdout."""
    parts = []
    msg = res.get("msg")
    if msg:
        parts.append(str(msg).strip())
    for key in ("stderr", "module_stderr", "stdout", "module_stdout"):
        text = (res.get(key) or "").strip() if isinstance(res.get(key), str) else ""
        if text and text not in parts:
            parts.append(text[-1500:])
            break
    if not parts and res.get("results"):
        failed = [r for r in res["results"] if isinstance(r, dict) and r.get("failed")]
        if failed:
            return _result_message(failed[0])
    return "\n".join(parts) or "the task failed without a message (see the run's stdout)"


class HostProgress:
    """One line per host: the current task and ok/changed/failed counts (Ansible's recap
    counting: ok includes changed)."""

    def __init__(self, console: Console, playbook: str, hosts: list[str]) -> None:
        self.console = console
        self.playbook = playbook
        self.hosts = {h: HostState(h) for h in hosts}
        self.failures: list[HostFailure] = []
        self.stats: dict[str, dict[str, int]] = {}
        self._width = max([len(h) for h in hosts] + [8])
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> HostProgress:
        if self.console.live:
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        self._redraw()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker:
            self._ticker.join(timeout=2)
        self.console.set_block([])  # the recap that follows says it all, once
        self.console.end_block()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            self._redraw()

    def _host(self, name: str | None) -> HostState | None:
        if not name:
            return None
        if name not in self.hosts:
            self.hosts[name] = HostState(name)
            self._width = max(self._width, len(name))
        return self.hosts[name]

    def on_event(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if self.console.verbose and event.get("stdout"):
            self.console.line(event["stdout"])
        else:
            self.console.to_log(event.get("stdout") or "")
        host = self._host(data.get("host"))
        now = time.monotonic()
        if kind == "runner_on_start" and host:
            role = data.get("role") or None
            if role != host.role and not self.console.live and not self.console.verbose:
                self.console.line(f"  {host.name:<{self._width}}  role {role or '(play tasks)'}")
            host.role, host.task, host.task_started = role, data.get("task") or "?", now
        elif (
            kind
            in ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")
            and host
        ):
            took = now - host.task_started if host.task_started else 0.0
            res = data.get("res") or {}
            if kind == "runner_on_ok":
                host.ok += 1
                host.changed += bool(res.get("changed"))
            elif kind == "runner_on_skipped":
                host.skipped += 1
            elif kind == "runner_on_unreachable":
                host.unreachable = True
                self._fail(host, data, res)
            elif data.get("ignore_errors"):
                host.ok += 1  # Ansible counts an ignored failure as "ignored", not failed
            else:
                host.failed += 1
                self._fail(host, data, res)
            if (
                took >= SLOW_TASK_S
                and not self.console.live
                and not self.console.verbose
                and kind != "runner_on_skipped"
            ):
                self.console.line(
                    f"  {host.name:<{self._width}}  {self._task_name(data)}: "
                    f"{kind.removeprefix('runner_on_')} ({_duration(took)})"
                )
            host.task_started = 0.0
        elif kind == "playbook_on_stats":
            for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored"):
                for name, n in (data.get(key) or {}).items():
                    self.stats.setdefault(name, {})[key] = int(n)
            for name, counts in self.stats.items():
                h = self._host(name)
                if h:
                    h.ok, h.changed = counts.get("ok", h.ok), counts.get("changed", h.changed)
                    h.failed = counts.get("failures", h.failed)
                    h.task = "done" if not (h.failed or counts.get("dark")) else "FAILED"
        self._redraw()
        return True  # keep the event in the artifacts

    @staticmethod
    def _task_name(data: dict[str, Any]) -> str:
        role, task = data.get("role"), data.get("task") or "?"
        return f"{role} : {task}" if role else task

    def _fail(self, host: HostState, data: dict[str, Any], res: dict[str, Any]) -> None:
        task = self._task_name(data)
        message = _result_message(res)
        self.failures.append(HostFailure(host.name, task, message))
        host.task = f"FAILED: {data.get('task') or '?'}"
        self.console.line(
            f"  {host.name:<{self._width}}  FAILED {task}: "
            f"{message.splitlines()[0] if message else ''}"
        )

    def _redraw(self) -> None:
        now = time.monotonic()
        self.console.set_block([h.line(self._width, now) for h in self.hosts.values()])

    def recap(self) -> list[str]:
        lines = []
        for name, h in self.hosts.items():
            s = self.stats.get(name, {})
            lines.append(
                f"  {name:<{self._width}}  ok={s.get('ok', h.ok)} "
                f"changed={s.get('changed', h.changed)} "
                f"failed={s.get('failures', h.failed)} "
                f"unreachable={s.get('dark', int(h.unreachable))} "
                f"skipped={s.get('skipped', h.skipped)}"
            )
        return lines
