"""Fixtures for the runtime tests: an in-process runtime on a free loopback port, an HTTP client,
a fake cloud metadata service on loopback."""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
# rt_models and rt_helpers, importable by name (rt_models also by subprocesses via PYTHONPATH)
sys.path.insert(0, str(HERE))

from rt_helpers import EDGE_WORKERS, Client, FakeMetadata  # noqa: E402
from torchfleet_runtime.app import Service  # noqa: E402
from torchfleet_runtime.config import Config  # noqa: E402


@pytest.fixture
def start_runtime() -> Iterator[Callable[..., Service]]:
    """start_runtime(module, wait=True, **config) -> a started in-process Service on a free port
    (its `.runtime` is the model side, its `.port` the HTTP edge's)."""
    started: list[Service] = []
    threads: list[threading.Thread] = []

    def start(
        module: Any = None, wait: bool = True, shadow_module: Any = None, **overrides: Any
    ) -> Service:
        base = dict(
            port=0,
            spot_watch="off",
            input_shape=(4,),
            max_delay_ms=2.0,
            log_level="warning",
            edge_workers=EDGE_WORKERS,
        )
        base.update(overrides)
        svc = Service(Config(**base), module=module, shadow_module=shadow_module)
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


@pytest.fixture
def metadata_server() -> Iterator[tuple[ThreadingHTTPServer, str]]:
    """(srv, its URL): rt_helpers.FakeMetadata on loopback, both clouds'. A test narrows
    `srv.clouds`, posts a notice in `srv.notice[cloud]`, revokes tokens in `srv.valid`, and reads
    `srv.log`, `srv.issued`, `srv.polls`."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeMetadata)
    srv.daemon_threads = True
    srv.clouds = {"aws", "alicloud"}
    srv.serial = itertools.count(1)
    srv.valid = {"aws": set(), "alicloud": set()}
    srv.issued = {"aws": 0, "alicloud": 0}
    srv.polls = {"aws": 0, "alicloud": 0}
    srv.notice = {"aws": "", "alicloud": ""}
    srv.log = []
    threading.Thread(
        target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    ).start()  # quick shutdown
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
