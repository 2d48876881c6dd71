"""Plain helpers for the runtime tests (fixtures live in conftest.py): an HTTP client, a metric
reader, a raw-socket exchange and its response parser, a wait on another thread's state, a
`torchfleet-runtime serve` subprocess, the admin token, two replicas' CPU sets, and a fake cloud
metadata service.

Importable by name (conftest.py puts this directory on sys.path). Test modules import these from
here, never from conftest (with several test directories in one pytest call, each conftest on
sys.path, `conftest` can name another directory's) nor from another test module
(tests/repo/test_test_imports.py holds both).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

# Edge processes in front of the model owner for every runtime a test starts: 2 (the harder case)
# unless TORCHFLEET_TEST_EDGE_WORKERS says otherwise (0: the edge in the test's process).
EDGE_WORKERS = int(os.environ.get("TORCHFLEET_TEST_EDGE_WORKERS", "2"))

ADMIN = "admin-token-abcdefghijkl"  # the admin token of the runtimes that take one
AUTH = {"Authorization": f"Bearer {ADMIN}"}

MASK = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(MASK) < 2, reason="needs 2 CPUs")
A, B = (MASK + MASK)[:2]  # the first two CPUs this process may use
TWO = ((A,), (B,))  # devices: [A, B], as the settings contract parses it
LABELS = (f"cpu:{A}", f"cpu:{B}")


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll a state the test cannot be notified of (another thread's queue, a server's state)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list]:
    """Run `fn` in a daemon thread; -> (the thread, a list that receives fn's result)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


class Client:
    """A keep-alive HTTP/1.1 client for one server; `call` returns (status, headers, body)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        self.conn.request(method, path, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.will_close:
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        return resp.status, dict(resp.getheaders()), data

    def predict(self, inputs: Any, **kw: Any) -> tuple[int, dict[str, str], Any]:
        status, headers, data = self.call(
            "POST",
            "/v1/predict",
            json.dumps({"inputs": inputs}).encode(),
            {"Content-Type": "application/json", **kw},
        )
        return status, headers, json.loads(data)

    def get_json(self, path: str) -> tuple[int, Any]:
        status, _, data = self.call("GET", path)
        return status, json.loads(data)

    def close(self) -> None:
        self.conn.close()


def metric_value(text: str, name: str, labels: str = "") -> float:
    """The sum of the series of `name` in a Prometheus exposition that carry every one of
    `labels` (`code="200"`, or `code="200",route="/v1/predict"`; none: every series of `name`),
    as PromQL's `sum(name{labels})` reads it; 0 when none does."""
    want: set[tuple[str, str]] = set()
    if labels:
        (probe,) = text_string_to_metric_families(f"probe{{{labels}}} 1\n")
        want = set(probe.samples[0].labels.items())
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and want <= set(sample.labels.items()):
                total += sample.value
    return total


class RawResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"RawResponse({self.status}, {self.headers}, {self.body[:200]!r})"


def parse_responses(data: bytes) -> list[RawResponse]:
    """Every complete HTTP/1.1 response in `data` (llhttp's response parser; 1xx included)."""
    import httptools

    out: list[RawResponse] = []

    class Sink:
        def on_message_begin(self) -> None:
            self.headers: dict[str, str] = {}
            self.body = b""

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers[name.decode().title()] = value.decode("latin-1")

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            out.append(RawResponse(parser.get_status_code(), self.headers, self.body))

    sink = Sink()
    parser = httptools.HttpResponseParser(sink)
    rest = data
    while rest:
        try:
            parser.feed_data(rest)
            rest = b""
        except httptools.HttpParserUpgrade:
            rest = b""
        except httptools.HttpParserError:
            if (
                out and out[-1].status == 100
            ):  # llhttp stops after an interim answer: go on with the rest
                idx = data.find(b"\r\n\r\n", data.find(b"HTTP/1.1 100")) + 4
                parser = httptools.HttpResponseParser(sink)
                rest, data = data[idx:], data[idx:]
                continue
            raise
    return out


def raw_exchange(
    port: int,
    data: bytes | list[bytes],
    timeout: float = 10.0,
    half_close: bool = True,
    pause_s: float = 0.0,
) -> tuple[list[RawResponse], bool]:
    """Send `data` (pieces with `pause_s` between them) on a fresh connection, half-close, read
    until the server closes or `timeout`; -> (responses, closed_by_server)."""
    pieces = [data] if isinstance(data, bytes) else data
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            for i, piece in enumerate(pieces):
                if i and pause_s:
                    time.sleep(pause_s)
                s.sendall(piece)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = b""
        closed = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
    return parse_responses(got), closed


CLI = str(Path(sys.executable).with_name("torchfleet-runtime"))


class ServeProcess:
    """`torchfleet-runtime serve` on a free port; the port is read from its 'listening on' log line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [CLI, "serve", "--port", "0", "--spot-watch", "off", *args],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TORCHFLEET_EDGE_WORKERS": str(EDGE_WORKERS), **env},
        )
        self.log: list[str] = []
        for line in self.proc.stderr:
            self.log.append(line)
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        else:
            raise AssertionError("serve exited before listening:\n" + "".join(self.log))
        self._reader = threading.Thread(
            target=lambda: self.log.extend(self.proc.stderr), daemon=True
        )
        self._reader.start()

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# --- a fake cloud metadata service (the fixture metadata_server in conftest.py serves it) ----

TTL = {
    "aws": "X-aws-ec2-metadata-token-ttl-seconds",
    "alicloud": "X-aliyun-ecs-metadata-token-ttl-seconds",
}
TOKEN = {"aws": "X-aws-ec2-metadata-token", "alicloud": "X-aliyun-ecs-metadata-token"}
NOTICE = {
    "aws": "/latest/meta-data/spot/instance-action",
    "alicloud": "/latest/meta-data/instance/spot/termination-time",
}
REFUSED = {"aws": 401, "alicloud": 403}  # what each answers a request without a valid token


class FakeMetadata(BaseHTTPRequestHandler):
    """Both clouds' metadata services at one address: PUT /latest/api/token with a cloud's TTL
    header hands out that cloud's token; a GET is that cloud's when it carries its token header
    (else the one cloud switched on). Tokenless or stale-token GETs are refused. The log keeps
    header names lower-cased: they are case-insensitive, and urllib title-cases them."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        s = self.server
        s.log.append(("PUT", self.path, {k.lower(): v for k, v in self.headers.items()}))
        clouds = [c for c in s.clouds if self.headers.get(TTL[c])]
        if self.path != "/latest/api/token" or not s.clouds:
            return self._reply(404)
        if not clouds:
            return self._reply(400)  # both answer 400 to a PUT without their TTL header
        cloud = clouds[0]
        token = f"{cloud}-token-{next(s.serial)}"
        s.valid[cloud].add(token)
        s.issued[cloud] += 1
        self._reply(200, token)

    def do_GET(self) -> None:
        s = self.server
        s.log.append(("GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
        cloud = next((c for c in s.clouds if self.headers.get(TOKEN[c])), None)
        if cloud is None and len(s.clouds) == 1:
            cloud = next(iter(s.clouds))
        if cloud is None:
            return self._reply(404)
        if self.headers.get(TOKEN[cloud]) not in s.valid[cloud]:
            return self._reply(REFUSED[cloud], "token required")
        if self.path == NOTICE[cloud]:
            s.polls[cloud] += 1
            return self._reply(200, s.notice[cloud]) if s.notice[cloud] else self._reply(404)
        if self.path == "/latest/meta-data/instance-id":
            return self._reply(200, f"i-{cloud}")
        self._reply(404)


def notice_for(cloud: str) -> str:
    """A spot interruption notice as `cloud`'s metadata service posts it."""
    return (
        json.dumps({"action": "terminate", "time": "2026-11-30T20:00:00Z"})
        if cloud == "aws"
        else "2026-11-30T20:00:00Z"
    )
