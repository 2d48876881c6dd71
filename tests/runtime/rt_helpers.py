"""Plain helpers for the runtime tests (fixtures live in conftest.py): an HTTP client, a metric
reader, a raw-socket exchange and its response parser.

Importable by name (conftest.py puts this directory on sys.path). Test modules import these from
here, never from conftest: with several test directories in one pytest call, each conftest on
sys.path, `conftest` can name another directory's.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Edge processes in front of the model owner for every runtime a test starts: 2 (the harder case)
# unless TORCHFLEET_TEST_EDGE_WORKERS says otherwise (0: the edge in the test's process).
EDGE_WORKERS = int(os.environ.get("TORCHFLEET_TEST_EDGE_WORKERS", "2"))


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
