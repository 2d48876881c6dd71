"""Fixtures for the runtime tests: an in-process runtime on a free loopback port, an HTTP client."""

from __future__ import annotations

import http.client
import json
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # rt_models, importable by name (also by subprocesses via PYTHONPATH)

from torchfleet_runtime.app import Service  # noqa: E402
from torchfleet_runtime.config import Config  # noqa: E402


class Client:
    """A keep-alive HTTP/1.1 client for one server; `call` returns (status, headers, body)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        self.conn.request(method, path, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.will_close:
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        return resp.status, dict(resp.getheaders()), data

    def predict(self, inputs: Any, **kw: Any) -> tuple[int, dict[str, str], Any]:
        status, headers, data = self.call("POST", "/v1/predict", json.dumps({"inputs": inputs}).encode(),
                                          {"Content-Type": "application/json", **kw})
        return status, headers, json.loads(data)

    def get_json(self, path: str) -> tuple[int, Any]:
        status, _, data = self.call("GET", path)
        return status, json.loads(data)

    def close(self) -> None:
        self.conn.close()


def metric_value(text: str, name: str, labels: str = "") -> float:
    """The value of `name{labels}` in a Prometheus exposition (0 when absent)."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture
def start_runtime() -> Iterator[Callable[..., Service]]:
    """start_runtime(module, wait=True, **config) -> a started in-process Service on a free port
    (its `.runtime` is the model side, its `.port` the HTTP edge's)."""
    started: list[Service] = []
    threads: list[threading.Thread] = []

    def start(module: Any = None, wait: bool = True, **overrides: Any) -> Service:
        base = dict(port=0, spot_watch="off", input_shape=(4,), max_delay_ms=2.0, log_level="warning")
        base.update(overrides)
        svc = Service(Config(**base), module=module)
        started.append(svc)
        if wait:
            svc.start()
        else:
            svc.start_http()
            t = threading.Thread(target=svc.runtime.load_and_warm, daemon=True)
            t.start()
            threads.append(t)
        return svc

    yield start
    for svc in started:
        svc.close()
    for t in threads:
        t.join(10)


@pytest.fixture
def client_for() -> Iterator[Callable[[Any], Client]]:
    clients: list[Client] = []

    def make(svc: Any) -> Client:
        c = Client(svc.port)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()
