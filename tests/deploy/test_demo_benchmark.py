"""The demo's short benchmark (infra/deploy/demo.py `benchmark`): it runs the load generator as
the command a user would run (`torchfleet-bench load`, a separate process) against a node's
runtime port, here a loopback stub that honours the runtime's HTTP contract (auth on: 401 without
the demo's token), and prints what the tool prints; infra imports nothing of the tool."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from infra.deploy import demo

SHAPE = [3, 4, 4]
TOKEN = "demo-token-0123456789abcdef"


class Runtime(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    predictions = 0

    def log_message(self, *args):
        pass

    def _answer(self, doc):
        code = 200
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            code, doc = 401, {"error": {"type": "unauthorized", "message": "no token"}}
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer({"input_shape": SHAPE, "dtype": "float32"})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        assert self.headers["X-Shape"] == "1,3,4,4"  # the binary body the demo asks for
        type(self).predictions += self.headers.get("Authorization") == f"Bearer {TOKEN}"
        self._answer({"outputs": [[0.5, 0.25]]})


@pytest.fixture
def node():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Runtime)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()


def test_the_demo_runs_the_tool_and_shows_its_levels(node, console, text, monkeypatch):
    monkeypatch.setattr(demo, "BENCH_SECONDS", 0.3)
    Runtime.predictions = 0
    demo.benchmark(node, console, TOKEN)
    shown = text(console)
    assert f"$ torchfleet-bench load {node.url} --concurrency 1,8 --duration 0.3 --binary" in shown
    assert f"bench {node.url} · batch 1 · binary body 0.2 KiB · input 3x4x4 float32" in shown
    table = [line.split() for line in shown.splitlines() if line.split()[:1] in (["1"], ["8"])]
    assert [row[0] for row in table] == ["1", "8"]
    assert all(int(row[1]) == int(row[2]) > 0 and row[3] == "-" for row in table)  # all 200s
    assert Runtime.predictions >= sum(int(row[1]) for row in table)
    assert "load average" in shown


def test_without_the_tool_the_demo_says_so(node, console, text, monkeypatch):
    monkeypatch.setattr(demo.importlib.util, "find_spec", lambda name: None)
    Runtime.predictions = 0
    demo.benchmark(node, console, TOKEN)
    assert "skipped: torchfleet-bench is not installed here" in text(console)
    assert Runtime.predictions == 0
