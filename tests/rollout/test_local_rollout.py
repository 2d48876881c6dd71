"""Rollouts for real on loopback: three runtime processes behind Debian's HAProxy (the local
fleet's load balancer, infra/deploy/balancer.py), a client load running through HAProxy's
HTTPS listener throughout, `torchfleet rollout` (infra/rollout/command.py) moving the weights.

- a good candidate is promoted through every step with no failed client request;
- a candidate that answers 5xx is rolled back by the error guard, a several-times slower one by
  the p99 guard, each within one evaluation window: the failed requests stay within the canary's
  share of the requests sent while it was in the rotation, and none fail after the rollback;
- a model reference whose digest is wrong moves nothing.
The nodes' /metrics are the figures (ScrapeSource); PrometheusSource's queries are unit-tested.
No container; every load loop is bounded in requests and seconds."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra import client
from infra.cli import main as torchfleet
from infra.deploy.balancer import Backend, Balancer, free_port, issue_certificates
from infra.deploy.stage import EXIT_OK, EXIT_ROLLED_BACK, EXIT_USAGE
from infra.rollout.local import LocalFleet, LocalNode

REPO = Path(__file__).resolve().parents[2]
RT_MODELS = REPO / "tests" / "runtime"
ADMIN = "admin-token-0123456789abcdef"
NODES = 3
LOAD_MAX_REQUESTS = 60000  # per rollout, whatever happens
LOAD_MAX_S = 120.0
# Each client pauses this long between requests: a steady few hundred requests a second that
# neither reaches the count bound before the last step's window on a fast machine nor saturates
# two cores.
LOAD_PAUSE_S = 0.002
BODY = json.dumps({"inputs": [[1.0, 2.0, 3.0, 4.0]]}).encode()  # first value: rt_models.TRIGGER
# Tiny's answer to BODY (rt_models: y = W x + b with fixed weights), as JSON writes it
EXPECTED = [[3.0, 5.0, 10.5]]
ROLLOUT = [
    "--bake",
    "4s",
    "--window",
    "2s",
    "--guard",
    "min_requests=5",
    "--guard",
    "min_p99_increase_s=0.25",
]

pytestmark = pytest.mark.timeout(600)


def _write_model(path: Path, mode: str, version: str) -> str:
    import torch

    sys.path.insert(0, str(RT_MODELS))
    import rt_models

    torch.save(rt_models.switchable(mode).state_dict(), path)
    path.with_suffix(".json").write_text(json.dumps({"input_shape": [4], "version": version}))
    return f"{path}@sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"


@dataclass
class Fleet:
    folder: Path
    procs: list[subprocess.Popen[bytes]]
    lb: Balancer
    local: LocalFleet
    models: Path


def _start_node(folder: Path, name: str) -> tuple[subprocess.Popen[bytes], LocalNode]:
    port = free_port()
    home = folder / name
    home.mkdir()
    model = home / "model.pt"
    _write_model(model, "good", "v1")
    admin = folder / "admin-token"
    args = [
        str(Path(sys.executable).with_name("torchfleet-runtime")),
        "serve",
        *("--host", "127.0.0.1", "--port", str(port), "--model", str(model)),
        *("--model-format", "eager", "--factory", "rt_models:switchable"),
        *("--max-delay-ms", "2", "--max-batch-size", "8", "--admin-token", admin.read_text()),
        *("--spot-watch", "off", "--log-format", "text", "--log-level", "warning"),
        *("--shadow-model", str(home / "shadow.pt"), "--shadow-sample", "1.0"),
    ]
    env = dict(os.environ, PYTHONPATH=str(RT_MODELS))
    log = (folder / f"{name}.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, LocalNode(name, f"http://127.0.0.1:{port}", str(model), str(home / "shadow.pt"))


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{url} exited with {proc.returncode}")
        if client.request("GET", f"{url}/readyz", timeout=2)[0] == 200:
            return
        time.sleep(0.2)
    pytest.fail(f"{url} not ready in {timeout_s} s")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from infra.deploy.balancer import BalancerError  # noqa: F401  (haproxy is needed)

    folder = tmp_path_factory.mktemp("fleet")
    (folder / "admin-token").write_text(ADMIN)
    started = [_start_node(folder, f"node-{i}") for i in range(NODES)]
    procs = [p for p, _ in started]
    nodes = [n for _, n in started]
    lb = Balancer(
        folder / "lb",
        [Backend(n.name, "127.0.0.1", int(n.url.rsplit(":", 1)[1])) for n in nodes],
        issue_certificates(folder / "tls"),
        https_port=free_port(),
    )
    try:
        for p, n in started:
            _wait_ready(n.url, p)
        lb.start()
        for n in nodes:
            lb.wait_status(n.name, "UP")
        local = LocalFleet(folder / "state", lb, nodes, folder / "admin-token")
        local.describe()
        models = folder / "models"
        models.mkdir()
        yield Fleet(folder, procs, lb, local, models)
    finally:
        lb.stop()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


@dataclass
class Load:
    """Clients sending predictions through HAProxy until stopped: (monotonic time, status)."""

    fleet: Fleet
    clients: int = 3
    results: list[tuple[float, int]] = field(default_factory=list)
    wrong: int = 0  # 200 answers whose outputs are not the stable model's
    stop: threading.Event = field(default_factory=threading.Event)

    def run_client(self) -> None:
        ctx = client.Auth(cafile=str(self.fleet.lb.certificates.ca)).ssl_context()
        conn = http.client.HTTPSConnection(
            "localhost", self.fleet.lb.https_port, context=ctx, timeout=30
        )
        deadline = time.monotonic() + LOAD_MAX_S
        while not self.stop.is_set() and time.monotonic() < deadline:
            if len(self.results) >= LOAD_MAX_REQUESTS:
                break
            try:
                conn.request("POST", "/v1/predict", BODY, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                body = resp.read()
                status = resp.status
                if status == 200 and json.loads(body)["outputs"] != EXPECTED:
                    self.wrong += 1
            except (OSError, http.client.HTTPException):
                status = 0
                conn.close()
            self.results.append((time.monotonic(), status))
            self.stop.wait(LOAD_PAUSE_S)

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self.run_client) for _ in range(self.clients)]
        for t in self.threads:
            t.start()
        time.sleep(1.0)  # the load is steady before the rollout starts
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def statuses(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for _, s in self.results:
            out[s] = out.get(s, 0) + 1
        return out

    def failed(self, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(1 for t, s in self.results if since <= t < until and s != 200)

    def sent(self, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(1 for t, _ in self.results if since <= t < until)


def _rollout(fleet: Fleet, *args: str) -> int:
    return torchfleet(["rollout", "local", "--fleet", str(fleet.local.folder), *args])


def _versions(fleet: Fleet) -> set[str]:
    return {fleet.local.serving(n)[1] for n in fleet.local.nodes()}


def test_a_good_candidate_is_promoted_with_no_failed_request(fleet, capsys):
    ref = _write_model(fleet.models / "good.pt", "good", "v2")
    with Load(fleet) as load:
        code = _rollout(
            fleet, "--model", ref, "--strategy", "linear", "--steps", "34,67,100", *ROLLOUT
        )
        time.sleep(1.0)
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    assert "promoted: v2 serves 100 %" in out
    assert load.failed() == 0, load.statuses()
    assert load.sent() > 100
    assert _versions(fleet) == {"v2"}
    doc = fleet.local.state().read()
    assert doc["status"] == "promoted" and doc["previous"]["version"] == "v1"
    assert [e["step"] for e in doc["timeline"] if e["decision"] == "ok"][-1] == 3
    print(f"good: {load.sent()} requests, 0 failed\n{out}")  # the timeline, with -s


@pytest.mark.parametrize(("mode", "guard"), [("errors", "error_ratio"), ("slow", "p99")])
def test_a_bad_candidate_is_rolled_back_by_its_guard(fleet, capsys, mode, guard):
    stable = fleet.local.state().read()["stable"]["version"]
    ref = _write_model(fleet.models / f"{mode}.pt", mode, f"bad-{mode}")
    with Load(fleet) as load:
        began = time.monotonic()
        code = _rollout(fleet, "--model", ref, *ROLLOUT)
        ended = time.monotonic()
        time.sleep(2.0)
    out = capsys.readouterr().out
    assert code == EXIT_ROLLED_BACK, out
    assert f"guard {guard}:" in out
    assert _versions(fleet) == {stable}
    assert load.failed(since=ended) == 0
    during = load.sent(began, ended)
    failed = load.failed(began, ended)
    if mode == "errors":
        # the canary's 10 % of the requests of at most two windows, with slack for the ramp
        assert 0 < failed <= 0.2 * during, (failed, during)
    else:
        assert failed == 0
    doc = fleet.local.state().read()
    assert doc["status"] == "rolled_back" and doc["timeline"][-1]["guard"] == guard
    print(f"{mode}: {failed} of {during} requests failed during the rollout\n{out}")


def test_a_wrong_digest_moves_nothing(fleet, capsys):
    before = _versions(fleet)
    path = fleet.models / "other.pt"
    _write_model(path, "good", "v3")
    code = _rollout(fleet, "--model", f"{path}@sha256:{'0' * 64}", *ROLLOUT)
    assert code == EXIT_USAGE
    assert "nothing was changed" in capsys.readouterr().out
    assert _versions(fleet) == before
    weights = {s["weight"] for s in fleet.lb.servers().values()}
    assert weights == {"100"} or weights == {"1"}, weights


def test_shadow_finds_a_differing_candidate_without_any_client_seeing_it(fleet, capsys):
    ref = _write_model(fleet.models / "flipped.pt", "flipped", "bad-flipped")
    with Load(fleet) as load:
        code = _rollout(fleet, "--model", ref, "--strategy", "shadow", *ROLLOUT)
        time.sleep(1.0)
    out = capsys.readouterr().out
    assert code == EXIT_ROLLED_BACK, out
    assert "guard shadow_agreement" in out
    assert load.wrong == 0 and load.failed() == 0, (load.wrong, load.statuses())
    assert load.sent() > 50
    doc = fleet.local.state().read()
    assert doc["shadow"]["result"] == "differs"
    assert doc["shadow"]["argmax_agreement"] < 0.5
    # the shadow is gone from every node, and traffic never moved
    assert all(fleet.local.shadow_summary(n) is None for n in fleet.local.nodes())
    print(f"shadow: {load.sent()} requests, 0 failed, 0 wrong\n{out}")


@pytest.fixture
def prometheus(fleet: Fleet) -> Iterator[str]:
    """Debian's Prometheus scraping the three runtimes every second (static targets: each
    series carries job and instance, which the guards' join with torchfleet_model_info uses)."""
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is not installed: run `make setup`")
    work = fleet.folder / "prometheus"
    work.mkdir(exist_ok=True)
    targets = [u.removeprefix("http://") for u in fleet.local.urls().values()]
    (work / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: torchfleet-runtime\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=(work / "log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while client.request("GET", f"{url}/-/ready", timeout=2)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "prometheus never ready"
            time.sleep(0.2)
        time.sleep(3.0)  # a few scrapes of every target
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_guards_read_prometheus_where_there_is_one(fleet, prometheus, capsys):
    ref = _write_model(fleet.models / "errors-prom.pt", "errors", "bad-errors-prom")
    with Load(fleet) as load:
        began = time.monotonic()
        code = _rollout(
            fleet,
            "--model",
            ref,
            "--prometheus",
            prometheus,
            "--bake",
            "8s",
            "--window",
            "4s",
            "--guard",
            "min_requests=5",
        )
        ended = time.monotonic()
    out = capsys.readouterr().out
    assert code == EXIT_ROLLED_BACK, out
    assert "guard error_ratio:" in out
    during, failed = load.sent(began, ended), load.failed(began, ended)
    assert 0 < failed <= 0.25 * during, (failed, during)
    print(f"prometheus errors: {failed} of {during} requests failed\n{out}")
