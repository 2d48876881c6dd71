"""The production edge, for real on loopback: two runtime processes behind Debian's HAProxy
(infra/deploy/balancer.py, the local stand-in for the ALB/CLB) with a CA made for the run.

- TLS is verified against the run's CA, TLS 1.0 and 1.1 are refused (openssl s_client, with a
  TLS 1.2 handshake of the same command as the control), HTTP only redirects;
- no token or a wrong one is 401, the token 200;
- a token rotation under steady load fails no request;
- a spot notice on one of two nodes under steady load fails no request: the node agent's leave
  step (torchfleet_agent/leave.py) takes it out of HAProxy through the runtime API before its
  drain, as a cloud node leaves its target group.
No container: runtime processes and HAProxy on 127.0.0.1 only; every load loop is bounded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra import client
from infra.bootstrap.torchfleet_agent import leave
from infra.bootstrap.torchfleet_agent.imds import Imds
from infra.deploy.balancer import Backend, Balancer, LocalLeave, free_port, issue_certificates

REPO = Path(__file__).resolve().parents[2]
RT_MODELS = REPO / "tests" / "runtime"
FAKE_IMDS = REPO / "tests" / "bootstrap" / "fake_imds.py"
OLD = "old-token-0123456789abcdef"
NEW = "new-token-fedcba9876543210"
BODY = json.dumps({"inputs": [1.0, 2.0, 3.0, 4.0]}).encode()
LOAD_MAX_REQUESTS = 4000  # per load run, whatever happens
LOAD_MAX_S = 90.0
DRAIN_WORK_S = 2.0  # how long the leaving node's drain has work in flight

pytestmark = pytest.mark.timeout(300)


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is not installed: run `make setup` (scripts/setup.sh installs it)")


@dataclass
class Node:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Fleet:
    folder: Path
    nodes: list[Node]
    lb: Balancer
    tokens: Path
    token: list[str] = field(default_factory=lambda: [OLD])  # what the clients send now

    def auth(self, token: str | None = None) -> client.Auth:
        return client.Auth(token=token or self.token[0], cafile=str(self.lb.certificates.ca))


def _start_node(folder: Path, name: str, weights: Path, tokens: Path, imds: str | None) -> Node:
    port = free_port()
    log = folder / f"{name}.log"
    args = [
        str(Path(sys.executable).with_name("torchfleet-runtime")),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(weights),
        "--model-format",
        "eager",
        "--factory",
        "rt_models:tiny",
        "--input-shape",
        "4",
        "--max-delay-ms",
        "2",
        "--drain-timeout-s",
        "20",
        "--api-token-file",
        str(tokens),
        "--spot-watch",
        "off",  # the node agent watches and leaves first (node-vars on a group node)
        "--log-format",
        "text",
    ]
    env = dict(os.environ, PYTHONPATH=str(RT_MODELS))
    proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    return Node(name, port, proc, log)


def _wait_ready(node: Node, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            pytest.fail(f"{node.name} exited: {node.log.read_text()[-2000:]}")
        if client.request("GET", f"http://127.0.0.1:{node.port}/readyz", timeout=2)[0] == 200:
            return
        time.sleep(0.2)
    pytest.fail(f"{node.name} not ready in {timeout_s} s: {node.log.read_text()[-2000:]}")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    _need("haproxy")
    import torch

    sys.path.insert(0, str(RT_MODELS))
    import rt_models

    weights = tmp_path / "tiny.pt"
    torch.save(rt_models.tiny().state_dict(), weights)
    tokens = tmp_path / "api-tokens"
    tokens.write_text(OLD + "\n")
    nodes = [_start_node(tmp_path, f"node-{i}", weights, tokens, None) for i in range(2)]
    lb = Balancer(
        tmp_path / "lb",
        [Backend(n.name, "127.0.0.1", n.port) for n in nodes],
        issue_certificates(tmp_path / "tls"),
        https_port=free_port(),
        http_port=free_port(),
    )
    try:
        for n in nodes:
            _wait_ready(n)
        lb.start()
        for n in nodes:
            lb.wait_status(n.name, "UP")
        yield Fleet(tmp_path, nodes, lb, tokens)
    finally:
        lb.stop()
        for n in nodes:
            if n.proc.poll() is None:
                n.proc.send_signal(signal.SIGTERM)
        for n in nodes:
            try:
                n.proc.wait(30)
            except subprocess.TimeoutExpired:
                n.proc.kill()


class Load:
    """Two closed-loop clients through the load balancer, bounded in count and time; each
    request carries the fleet's current token. Every answer but a 200 counts as failed."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.codes: Counter[str] = Counter()
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._sent = 0
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        deadline = time.monotonic() + LOAD_MAX_S
        while not self.stop.is_set() and time.monotonic() < deadline:
            with self._lock:
                if self._sent >= LOAD_MAX_REQUESTS:
                    return
                self._sent += 1
            auth = self.fleet.auth()
            code, _, _ = client.request(
                "POST",
                self.fleet.lb.endpoint + "/v1/predict",
                BODY,
                {"Content-Type": "application/json"},
                timeout=30,
                auth=auth,
            )
            with self._lock:
                self.codes[str(code)] += 1

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(60)

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 60
        start = sum(self.codes.values())
        while sum(self.codes.values()) < start + count and time.monotonic() < deadline:
            time.sleep(0.05)

    @property
    def failed(self) -> int:
        return sum(n for code, n in self.codes.items() if code != "200")


def _status(url: str, fleet: Fleet, token: str | None) -> int | None:
    return client.request(
        "POST", url, BODY, {"Content-Type": "application/json"}, auth=fleet.auth(token)
    )[0]


def test_https_verified_against_the_runs_ca_and_a_token_required(fleet: Fleet):
    url = fleet.lb.endpoint + "/v1/predict"
    assert _status(url, fleet, OLD) == 200
    anonymous = client.Auth(cafile=str(fleet.lb.certificates.ca))
    assert (
        client.request("POST", url, BODY, {"Content-Type": "application/json"}, auth=anonymous)[0]
        == 401
    )
    assert _status(url, fleet, "wrong-token-0123456789") == 401
    assert client.request("GET", fleet.lb.endpoint + "/readyz", auth=anonymous)[0] == 200
    with pytest.raises(client.ClientError, match="certificate does not verify"):
        client.request("GET", fleet.lb.endpoint + "/readyz", auth=client.Auth())
    # plain HTTP only redirects to the HTTPS listener
    code, _, _ = client.request("GET", f"http://127.0.0.1:{fleet.lb.http_port}/v1/model")
    assert code == 301


def _handshake(port: int, version: str) -> subprocess.CompletedProcess[str]:
    # SECLEVEL=0 lets this client offer the old versions at all: a refusal is the server's
    return subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", f"-{version}"]
        + ["-cipher", "DEFAULT@SECLEVEL=0", "-brief"],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize("version", ["tls1", "tls1_1"])
def test_tls_1_0_and_1_1_are_refused(fleet: Fleet, version: str):
    _need("openssl")
    ok = _handshake(fleet.lb.https_port, "tls1_2")  # the same command, allowed 1.2: connects
    assert ok.returncode == 0 and "TLSv1.2" in ok.stdout + ok.stderr, ok.stderr
    old = _handshake(fleet.lb.https_port, version)
    assert old.returncode != 0, old.stdout
    assert "alert protocol version" in old.stderr or "unsupported protocol" in old.stderr, (
        old.stderr
    )


def _accepts(node: Node, token: str) -> bool:
    code = client.request(
        "POST",
        f"http://127.0.0.1:{node.port}/v1/predict",
        BODY,
        {"Content-Type": "application/json"},
        auth=client.Auth(token=token),
    )[0]
    return code == 200


def _until(check, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


def test_a_token_rotation_under_load_fails_no_request(fleet: Fleet):
    with Load(fleet) as load:
        load.wait_for(50)
        fleet.tokens.write_text(f"{OLD}\n{NEW}\n")  # 1: both accepted while clients move over
        _until(lambda: all(_accepts(n, NEW) for n in fleet.nodes), "every node accepts NEW")
        load.wait_for(50)
        fleet.token[0] = NEW  # 2: the clients send the new one
        load.wait_for(50)
        fleet.tokens.write_text(f"{NEW}\n")  # 3: the old one retired
        _until(lambda: not any(_accepts(n, OLD) for n in fleet.nodes), "every node refuses OLD")
        load.wait_for(50)
    print(f"rotation under load: {dict(load.codes)}")
    assert load.failed == 0, load.codes
    assert load.codes["200"] >= 200
    assert _status(fleet.lb.endpoint + "/v1/predict", fleet, OLD) == 401


def _in_flight(node: Node) -> float:
    _, text, _ = client.request("GET", f"http://127.0.0.1:{node.port}/metrics", timeout=5)
    for line in text.decode().splitlines():
        if line.startswith("torchfleet_inflight_requests "):
            return float(line.split()[1])
    return 0.0


def _answers(metadata: Imds) -> bool:
    try:
        return metadata.get("instance-id") == "i-node1"
    except OSError:
        return False


def test_a_spot_notice_under_load_fails_no_request(fleet: Fleet, tmp_path: Path):
    imds_state = tmp_path / "imds"
    imds_state.mkdir()
    (imds_state / "imds.json").write_text(json.dumps({"instance-id": "i-node1"}))
    port = free_port()
    imds = subprocess.Popen([sys.executable, str(FAKE_IMDS), str(port), str(imds_state)])
    leaving = fleet.nodes[1]
    seen: list[str] = []  # what HAProxy said about the node while its runtime drained
    in_flight: list[bytes] = []  # work the leaving node holds when its drain begins

    def drain() -> None:
        """SIGTERM while a request is in flight (admitted, its body still arriving, as a large
        upload or a long GPU batch): the drain lasts DRAIN_WORK_S, and a balancer that still
        sent this node new requests meanwhile would have them answered 503."""
        seen.append(fleet.lb.servers()[leaving.name]["status"])
        head = (
            f"POST /v1/predict HTTP/1.1\r\nHost: node\r\nAuthorization: Bearer {OLD}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
        ).encode()
        if seen == ["DRAIN"]:  # what the balancer sent before it left is done within moments
            _until(lambda: _in_flight(leaving) == 0, "the balancer's last requests are answered")
        with socket.create_connection(("127.0.0.1", leaving.port), timeout=60) as sock:
            sock.sendall(head + BODY[:5])
            _until(lambda: _in_flight(leaving) >= 1, "the request is admitted")
            leaving.proc.send_signal(signal.SIGTERM)
            time.sleep(DRAIN_WORK_S)
            sock.sendall(BODY[5:])
            answer = b""
            while b"\r\n" not in answer and (chunk := sock.recv(65536)):
                answer += chunk
            in_flight.append(answer)
        assert leaving.proc.wait(60) == 0

    metadata = Imds("aws", f"http://127.0.0.1:{port}")
    stop = threading.Event()
    watcher = threading.Thread(
        target=leave.watch_notice,
        args=(
            lambda: metadata.get("spot/instance-action"),
            lambda notice: leave.leave_then_drain(
                LocalLeave(fleet.lb, leaving.name), drain, leave.SETTLE_S["local"], notice
            ),
            0.2,
            stop,
        ),
        daemon=True,
    )
    try:
        _until(lambda: _answers(metadata), "the fake metadata service answers")
        watcher.start()
        with Load(fleet) as load:
            load.wait_for(100)
            notice = {"action": "terminate", "time": "2026-03-02T10:19:00Z"}
            (imds_state / "imds.json").write_text(
                json.dumps({"instance-id": "i-node1", "spot/instance-action": json.dumps(notice)})
            )
            watcher.join(90)
            assert not watcher.is_alive(), "the notice was never acted on"
            load.wait_for(100)  # the other node carries the load alone now
    finally:
        stop.set()
        imds.terminate()
        imds.wait(10)
    print(f"spot notice under load: {dict(load.codes)}; haproxy at drain: {seen}")
    assert seen == ["DRAIN"]  # out of the rotation before its drain began
    assert in_flight[0].startswith(b"HTTP/1.1 200"), in_flight  # held when its drain began
    assert load.failed == 0, load.codes
    assert leaving.proc.returncode == 0
    assert fleet.lb.servers()[fleet.nodes[0].name]["status"].startswith("UP")
