"""Structured logs: JSON lines with the contract's keys, a per-request debug line, 4xx at info and
5xx at error with the request id, and one batch summary per interval instead of a line per batch."""

from __future__ import annotations

import io
import json
import logging

import pytest
import rt_models
from rt_helpers import Client
from torchfleet_runtime.logs import BatchSummary, JsonFormatter, TextFormatter, choose_format

pytestmark = pytest.mark.timeout(120)


def record(msg: str = "hello %s", args: tuple = ("world",), **extra) -> logging.LogRecord:
    r = logging.LogRecord("torchfleet_runtime.x", logging.INFO, __file__, 1, msg, args, None)
    r.__dict__.update(extra)
    return r


def test_json_lines_carry_ts_level_logger_msg_request_id_and_fields():
    doc = json.loads(
        JsonFormatter().format(
            record(request_id="r-1", fields={"status": 400, "type": "wrong_shape"})
        )
    )
    assert (
        doc["msg"] == "hello world"
        and doc["level"] == "info"
        and doc["logger"] == "torchfleet_runtime.x"
    )
    assert doc["request_id"] == "r-1" and doc["status"] == 400 and doc["type"] == "wrong_shape"
    assert doc["ts"].endswith("Z") and "T" in doc["ts"]
    text = TextFormatter().format(record(request_id="r-1", fields={"status": 400}))
    assert text.endswith("hello world request_id=r-1 status=400")


def test_auto_format_is_json_unless_a_terminal():
    assert choose_format("auto", io.StringIO()) == "json"

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert choose_format("auto", Tty()) == "text" and choose_format("json", Tty()) == "json"


def test_batch_summary_is_one_line_per_interval():
    now = [0.0]
    logger = logging.getLogger("test.summary")
    lines: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = lines.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    s = BatchSummary(logger, 10.0, clock=lambda: now[0])
    for i in range(1000):  # 100 batches/s for 10 s
        now[0] = i * 0.01
        s.add(4, 4, "full", 0.005, "v1")
    now[0] = 10.0
    s.add(2, 2, "idle", 0.001, "v1")
    assert len(lines) == 1
    f = lines[0].fields
    assert (
        f["batches"] == 1001
        and f["instances"] == 4002
        and f["reasons"] == {"full": 1000, "idle": 1}
    )
    assert f["model_version"] == "v1" and f["max_batch"] == 4


def test_requests_log_at_debug_client_errors_at_info_with_the_request_id(start_runtime, caplog):
    svc = start_runtime(rt_models.tiny(), max_batch_size=2)
    caplog.set_level(logging.DEBUG, logger="torchfleet_runtime.request")
    c = Client(svc.port)
    c.predict([1.0, 2.0, 3.0, 4.0], **{"X-Request-Id": "ok-1"})
    c.predict([1.0, 2.0], **{"X-Request-Id": "bad-1"})
    svc.settle()  # an edge process's requests are logged by the owner as they are reported
    by_id = {r.request_id: r for r in caplog.records if r.name == "torchfleet_runtime.request"}
    assert by_id["ok-1"].levelname == "DEBUG" and by_id["ok-1"].fields["status"] == 200
    assert {"decode_ms", "queue_ms", "model_ms", "encode_ms"} <= set(by_id["ok-1"].fields)
    assert by_id["bad-1"].levelname == "INFO" and by_id["bad-1"].fields["type"] == "wrong_shape"
