"""Rollouts for real on loopback: three runtime processes behind Debian's HAProxy (the local
fleet's load balancer, infra/deploy/balancer.py), a client load running through HAProxy's
HTTPS listener throughout, `torchfleet rollout` (infra/rollout/command.py) moving the weights.

- a good candidate is promoted through every step with no failed client request;
- a candidate that answers 5xx is rolled back by the error guard, a several-times slower one by
  the p99 guard, each within one evaluation window: the failed requests stay within the canary's
  share of the requests sent while it was in the rotation, and none fail after the rollback;
- over a stable whose p99 lies between 100 and 250 ms (one latency bucket before the
  buckets became fine), a candidate 1.5x slower at every batch size is rolled back by the p99
  guard at its default 1.2, after the command said what that guard can see; a max_p99_ratio
  finer than the buckets there is refused, nothing moved;
- a candidate whose latency-budget batch cap falls to a quarter is rolled back by the capacity
  guard (the nodes size their cap by latency: no --max-batch-size);
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


# Every model costs this per instance (a batch of 256 about 51 ms): the capacity the runtimes
# measure at warm-up is then the model's, not the microsecond noise of a bare linear layer on a
# shared CPU (which moved by a third between two files of the same model).
ITEM_S = 0.0002


def _write_model(path: Path, mode: str, version: str, **cost: float) -> str:
    """A Switchable model file and its sidecar; `cost`: pace_s, item_s (rt_models)."""
    import torch

    sys.path.insert(0, str(RT_MODELS))
    import rt_models

    cost.setdefault("item_s", ITEM_S)
    torch.save(rt_models.switchable(mode, **cost).state_dict(), path)
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
        *("--max-delay-ms", "2", "--admin-token", admin.read_text()),
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


# The stable's pace and the slow candidate's (1.5x): with three clients, a request waits for at
# most one batch before its own, so the stable's p99 sits between one and two paces (100-250 ms).
PACE_S = 0.1
SLOWER = 1.5
# Two of three nodes at 67 %: each node, candidate or stable, takes a third of the requests (at
# 50 % the one stable node would take twice a candidate node's and queue more).
SPLIT_EVENLY = ("--strategy", "linear", "--steps", "67,100")
GUARDED = ("--bake", "8s", "--window", "4s", "--guard", "min_requests=10")


def _stable_version(fleet: Fleet) -> str:
    """The recorded stable version, or (before any rollout) the one every node serves."""
    recorded = fleet.local.state().read()["stable"]
    if recorded:
        return str(recorded["version"])
    (serving,) = versions(fleet.local)
    return serving


def _paced_stable(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> str:
    """Every node on a model paced at PACE_S per batch (promoted at once, only the error guard
    in force: its p99 is meant to be higher); its version."""
    stable = "paced"
    if _stable_version(fleet) != stable:
        ref = _write_model(fleet.models / "paced.pt", "good", stable, pace_s=PACE_S)
        args = ("--model", ref, "--strategy", "all-at-once", *GUARDED)
        code = under_load(
            _load(fleet), lambda: _rollout(fleet, *args, "--guard", "min_p99_increase_s=10"), 0.5
        )[0]
        assert code == EXIT_OK, capsys.readouterr().out
    capsys.readouterr()
    return stable


def test_a_candidate_slower_by_half_over_a_p99_between_100_and_250_ms_is_rolled_back(fleet, capsys):
    stable = _paced_stable(fleet, capsys)
    ref = _write_model(fleet.models / "slower.pt", "good", "slower", pace_s=PACE_S * SLOWER)
    load = _load(fleet)
    run = lambda: _rollout(fleet, "--model", ref, *SPLIT_EVENLY, *GUARDED)  # noqa: E731
    code, began, ended = under_load(load, run, 1.0)
    out = capsys.readouterr().out
    assert code == EXIT_ROLLED_BACK, out
    check_rolled_back(fleet.local, load, out, "p99", stable, (began, ended), answers_5xx=False)
    # before the first step: the stable's p99 and the ratio the buckets resolve there
    line = next(x for x in out.splitlines() if x.startswith("p99 guard: stable p99"))
    p99_ms = float(line.split("stable p99 ", 1)[1].split(" ms", 1)[0])
    ratio = float(line.split("tell apart there is ", 1)[1].split(" ", 1)[0])
    assert 100 <= p99_ms <= 250 and ratio <= 1.2, line
    numbers = fleet.local.state().read()["timeline"][-1]["numbers"]
    seen = numbers["candidate"]["p99_s"] / numbers["stable"]["p99_s"]
    assert seen > 1.2, numbers
    print(f"p99: {line}\n{out}")


def test_a_max_p99_ratio_finer_than_the_buckets_is_refused(fleet, capsys):
    _paced_stable(fleet, capsys)
    before = versions(fleet.local)
    ref = _write_model(fleet.models / "fine.pt", "good", "fine")
    fine = ("--guard", "max_p99_ratio=1.05", "--guard", "min_p99_increase_s=0")
    args = ("--model", ref, *GUARDED, *fine)
    code = under_load(_load(fleet), lambda: _rollout(fleet, *args), 0.5)[0]
    out = capsys.readouterr().out
    assert code == EXIT_USAGE, out
    assert "max_p99_ratio = 1.05 is invalid" in out and "tell apart there is" in out, out
    assert versions(fleet.local) == before
    assert fleet.local.state().read()["status"] != "running"


# A quarter of the stable's cap takes this long per batch in the candidate: within the default
# 100 ms latency budget, twice as many instances are not.
QUARTER_CAP_S = 0.08


def test_a_candidate_whose_batch_cap_falls_to_a_quarter_is_rolled_back_by_capacity(fleet, capsys):
    stable = _stable_version(fleet)
    node = fleet.local.nodes()[0]
    card = client.get_json(client.Target.parse(fleet.local.urls()[node]), "/v1/model", timeout=5)
    cap = card["max_batch_size"]  # Tiny's, sized by the latency budget on this machine
    assert cap >= 8 and card["batch_cap_method"] == "latency", card
    item_s = QUARTER_CAP_S / (cap // 4)
    ref = _write_model(fleet.models / "narrow.pt", "good", "narrow", item_s=item_s)
    load = _load(fleet)
    code, began, ended = under_load(load, lambda: _rollout(fleet, "--model", ref, *GUARDED), 1.0)
    out = capsys.readouterr().out
    assert code == EXIT_ROLLED_BACK, out
    check_rolled_back(fleet.local, load, out, "capacity", stable, (began, ended), answers_5xx=False)
    numbers = fleet.local.state().read()["timeline"][-1]["numbers"]
    cand, base = numbers["candidate"], numbers["stable"]
    assert base["batch_cap"] == cap and cand["batch_cap"] == cap // 4, numbers
    assert cand["capacity_items_per_s"] < 0.8 * base["capacity_items_per_s"], numbers
    # the node that ran it said so: its log and its last reload (back to the stable now)
    log = (fleet.folder / f"{node}.log").read_text()
    assert f"the batch cap changed from {cap} to {cap // 4}" in log, log[-2000:]
    print(f"capacity: {numbers}\n{out}")
