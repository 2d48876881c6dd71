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
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from live_fleet import (
    Load,
    check_promoted,
    check_rolled_back,
    check_shadow_differs,
    rollout,
    under_load,
    versions,
)
from live_fleet import prometheus as live_prometheus

from infra import client
from infra.deploy.balancer import Backend, Balancer, free_port, issue_certificates
from infra.deploy.stage import EXIT_OK, EXIT_ROLLED_BACK, EXIT_USAGE
from infra.rollout.local import LocalFleet, LocalNode

REPO = Path(__file__).resolve().parents[2]
RT_MODELS = REPO / "tests" / "runtime"
ADMIN = "admin-token-0123456789abcdef"
NODES = 3
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


def _load(fleet: Fleet) -> Load:
    return Load(
        fleet.lb.https_port,
        str(fleet.lb.certificates.ca),
        BODY,
        {"Content-Type": "application/json"},
        lambda body: json.loads(body)["outputs"] == EXPECTED,
    )


def _rollout(fleet: Fleet, *args: str) -> int:
    return rollout("local", fleet.local.folder, *args)


def test_a_good_candidate_is_promoted_with_no_failed_request(fleet, capsys):
    ref = _write_model(fleet.models / "good.pt", "good", "v2")
    args = ("--model", ref, "--strategy", "linear", "--steps", "34,67,100", *ROLLOUT)
    load = _load(fleet)
    code = under_load(load, lambda: _rollout(fleet, *args), 1.0)[0]
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    check_promoted(fleet.local, load, out, "v2", steps=3)
    assert fleet.local.state().read()["previous"]["version"] == "v1"
    print(f"good: {load.sent()} requests, 0 failed\n{out}")  # the timeline, with -s


@pytest.mark.parametrize(("mode", "guard"), [("errors", "error_ratio"), ("slow", "p99")])
def test_a_bad_candidate_is_rolled_back_by_its_guard(fleet, capsys, mode, guard):
    stable = fleet.local.state().read()["stable"]["version"]
    ref = _write_model(fleet.models / f"{mode}.pt", mode, f"bad-{mode}")
    load = _load(fleet)
    code, began, ended = under_load(load, lambda: _rollout(fleet, "--model", ref, *ROLLOUT), 2.0)
    out = capsys.readouterr().out
    assert code == EXIT_ROLLED_BACK, out
    failed, during = check_rolled_back(
        fleet.local, load, out, guard, stable, (began, ended), answers_5xx=mode == "errors"
    )
    print(f"{mode}: {failed} of {during} requests failed during the rollout\n{out}")


def test_a_wrong_digest_moves_nothing(fleet, capsys):
    before = versions(fleet.local)
    path = fleet.models / "other.pt"
    _write_model(path, "good", "v3")
    code = _rollout(fleet, "--model", f"{path}@sha256:{'0' * 64}", *ROLLOUT)
    assert code == EXIT_USAGE
    assert "nothing was changed" in capsys.readouterr().out
    assert versions(fleet.local) == before
    weights = {s["weight"] for s in fleet.lb.servers().values()}
    assert weights == {"100"} or weights == {"1"}, weights


def test_shadow_finds_a_differing_candidate_without_any_client_seeing_it(fleet, capsys):
    before = versions(fleet.local)
    ref = _write_model(fleet.models / "flipped.pt", "flipped", "bad-flipped")
    load = _load(fleet)
    args = ("--model", ref, "--strategy", "shadow", *ROLLOUT)
    code = under_load(load, lambda: _rollout(fleet, *args), 1.0)[0]
    out = capsys.readouterr().out
    assert code == EXIT_ROLLED_BACK, out
    check_shadow_differs(fleet.local, load, out, before)
    print(f"shadow: {load.sent()} requests, 0 failed, 0 wrong\n{out}")


@pytest.fixture
def prometheus(fleet: Fleet) -> Iterator[str]:
    """Debian's Prometheus scraping the three runtimes every second."""
    targets = [u.removeprefix("http://") for u in fleet.local.urls().values()]
    with live_prometheus(fleet.folder / "prometheus", targets) as url:
        yield url


def test_the_guards_read_prometheus_where_there_is_one(fleet, prometheus, capsys):
    ref = _write_model(fleet.models / "errors-prom.pt", "errors", "bad-errors-prom")
    with _load(fleet) as load:
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
