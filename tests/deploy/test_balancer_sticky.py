"""An A/B that holds per client on the local load balancer: with `sticky_header`, real HAProxy
sends every request carrying one value of the header to one server, while the weights still
split the values (a weight set at runtime applies); without the header, round robin. The
backends are two tiny HTTP servers on loopback that answer with their own name."""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from infra import client
from infra.deploy.balancer import (
    Backend,
    Balancer,
    BalancerError,
    free_port,
    issue_certificates,
)

pytestmark = pytest.mark.timeout(120)
HEADER = "X-Client-Id"
CLIENTS = 40  # header values; each sends REPEAT requests
REPEAT = 3


def _server(name: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = name.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def balancer(tmp_path: Path) -> Iterator[Balancer]:
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed: run `make setup` (scripts/setup.sh installs it)")
    servers = {name: _server(name) for name in ("stable", "candidate")}
    lb = Balancer(
        tmp_path / "lb",
        [Backend(n, "127.0.0.1", s.server_address[1]) for n, s in servers.items()],
        issue_certificates(tmp_path / "tls"),
        https_port=free_port(),
        sticky_header=HEADER,
    )
    try:
        lb.start()
        for name in servers:
            lb.wait_status(name, "UP")
        yield lb
    finally:
        lb.stop()
        for s in servers.values():
            s.shutdown()


def _get(lb: Balancer, client_id: str | None) -> str:
    headers = {HEADER: client_id} if client_id else {}
    status, body, _ = client.request(
        "GET",
        lb.endpoint + "/",
        headers=headers,
        timeout=10,
        auth=client.Auth(cafile=str(lb.certificates.ca)),
    )
    assert status == 200, (status, body)
    return body.decode()


def test_one_header_value_keeps_its_server_and_weights_split_the_values(balancer):
    assert f"balance hdr({HEADER})" in balancer.config.read_text()
    balancer.set_weight("stable", 180)
    balancer.set_weight("candidate", 20)  # about 10 % of the clients
    seen: dict[str, set[str]] = {}
    for i in range(CLIENTS):
        for _ in range(REPEAT):
            seen.setdefault(f"client-{i}", set()).add(_get(balancer, f"client-{i}"))
    assert all(len(servers) == 1 for servers in seen.values()), seen
    per_server = Counter(next(iter(s)) for s in seen.values())
    assert per_server["stable"] > per_server["candidate"], per_server
    # every value to the candidate when the stable server's weight is 0 (a runtime change)
    balancer.set_weight("stable", 0)
    assert {_get(balancer, f"client-{i}") for i in range(10)} == {"candidate"}
    balancer.set_weight("stable", 100)
    balancer.set_weight("candidate", 100)
    # no header: round robin over both
    assert {_get(balancer, None) for _ in range(6)} == {"stable", "candidate"}


def test_a_bad_header_name_is_refused(tmp_path):
    with pytest.raises(BalancerError, match="sticky_header = 'X Bad' is invalid"):
        Balancer(tmp_path, [], issue_certificates(tmp_path / "tls"), 1, sticky_header="X Bad")
