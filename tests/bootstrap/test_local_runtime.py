"""The agent asks its own runtime over loopback (torchfleet_agent/local.py): plain HTTP, or,
where the node's certificate of a tls.backend stack is on the node, HTTPS trusting exactly that
certificate (it names the stack's node name, not 127.0.0.1). A real TLS server on loopback with
a self-signed certificate made as infra/edge.py's node_certificate makes it (not a CA)."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import edge
from infra.bootstrap.torchfleet_agent import lifecycle, local


def _self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed server certificate for `name`, not a CA (as node_certificate makes it)."""
    cert, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
    done = subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=torchfleet test nodes",
            "-addext",
            f"subjectAltName=DNS:{name}",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return cert, key


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"ready" if self.path == "/readyz" else b"torchfleet_queue_depth 0\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_runtime(tmp_path: Path) -> Iterator[tuple[int, Path, Path]]:
    """A runtime stand-in serving HTTPS on loopback with the node certificate; (port, that
    certificate, another self-signed certificate for the same name)."""
    cert, key = _self_signed(tmp_path, edge.NODE_NAME)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other, _ = _self_signed(other_dir, edge.NODE_NAME)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], cert, other
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_the_agent_asks_its_runtime_over_https_trusting_the_node_certificate(https_runtime):
    port, cert, other = https_runtime
    cfg = {"service_port": port}
    assert local.runtime_url(cfg, "/readyz", cert=str(cert)).startswith("https://127.0.0.1:")
    with local.open_runtime(cfg, "/readyz", cert=str(cert)) as resp:
        assert resp.status == 200 and resp.read() == b"ready"
    # another certificate, even for the same name, is not trusted
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        local.open_runtime(cfg, "/readyz", cert=str(other))


def test_without_the_node_certificate_the_agent_speaks_plain_http(tmp_path):
    absent = str(tmp_path / "absent.pem")
    assert local.runtime_url({"service_port": 8123}, "/metrics", cert=absent) == (
        "http://127.0.0.1:8123/metrics"
    )


def test_the_launch_hook_waits_for_readyz_over_https(https_runtime, monkeypatch):
    port, cert, _ = https_runtime
    monkeypatch.setattr(local, "NODE_TLS_CERT", str(cert))
    lifecycle.wait_ready({"service_port": port}, timeout=10)  # returns once /readyz is 200
