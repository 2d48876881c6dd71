"""Logging: JSON lines for machines, text for people, and a batch summary cheap enough for info.

`setup(level, format)`: format `json` writes one JSON object per line to stderr with `ts` (UTC,
ISO 8601, milliseconds), `level`, `logger`, `msg`, `request_id` where the record has one, and
the record's `fields` (pass `extra={"fields": {...}, "request_id": rid}`); `exc` holds a
traceback. `text` is the classic one-line format (fields appended as k=v). `auto` (the default)
picks json when stderr is not a terminal (systemd, containers) and text on a terminal.

What is logged at which level (the contract of issue 10): one line per request at debug; the
batcher's activity at info as one summary line per `log_summary_s` (`BatchSummary`), never a
line per batch; every 4xx at info and every 5xx at error, each with its request id.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            doc["request_id"] = rid
        fields = getattr(record, "fields", None)
        if fields:
            for k, v in fields.items():
                doc.setdefault(k, v)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = []
        rid = getattr(record, "request_id", None)
        if rid:
            extra.append(f"request_id={rid}")
        for k, v in (getattr(record, "fields", None) or {}).items():
            extra.append(f"{k}={v}")
        if extra:
            first, nl, rest = line.partition("\n")
            line = first + " " + " ".join(extra) + nl + rest
        return line


def choose_format(fmt: str, stream: Any = None) -> str:
    if fmt != "auto":
        return fmt
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def setup(level: str, fmt: str = "auto") -> str:
    """Configure the root logger once for the process; returns the format chosen."""
    chosen = choose_format(fmt)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return chosen


class BatchSummary:
    """Aggregates batch runs and emits one info line per `interval_s` (from the thread that
    adds the batch that crosses the interval: no timer thread, no line when idle)."""

    def __init__(
        self, logger: logging.Logger, interval_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._reset(clock())

    def _reset(self, now: float) -> None:
        self._since = now
        self._batches = 0
        self._instances = 0
        self._padded = 0
        self._model_s = 0.0
        self._max_model_s = 0.0
        self._max_size = 0
        self._reasons: Counter = Counter()

    def add(self, size: int, bucket: int, reason: str, model_s: float, version: str) -> None:
        if self._interval <= 0:
            return
        with self._lock:
            self._batches += 1
            self._instances += size
            self._padded += bucket - size
            self._model_s += model_s
            self._max_model_s = max(self._max_model_s, model_s)
            self._max_size = max(self._max_size, size)
            self._reasons[reason] += 1
            now = self._clock()
            if now - self._since < self._interval:
                return
            fields = {
                "interval_s": round(now - self._since, 3),
                "batches": self._batches,
                "instances": self._instances,
                "mean_batch": round(self._instances / self._batches, 2),
                "max_batch": self._max_size,
                "padded": self._padded,
                "model_ms_mean": round(self._model_s / self._batches * 1000, 3),
                "model_ms_max": round(self._max_model_s * 1000, 3),
                "reasons": dict(self._reasons),
                "model_version": version,
            }
            self._reset(now)
        self._log.info(
            "batches: %d runs, %d instances, mean batch %.2f",
            fields["batches"],
            fields["instances"],
            fields["mean_batch"],
            extra={"fields": fields},
        )
