"""The demo's node path, which is `torchfleet up`'s node stage, for real, and a rollout on the
fleet it makes: three systemd container nodes, the stack-shaped inventory of the mock-engine
aws-dev run with the containers' addresses, site.yml + verify.yml through ansible-runner, the
readiness wait through an SSH tunnel, the prediction through the stack's endpoint (HAProxy in
front of the nodes: HTTPS verified against the demo's CA, with the API token), 401 there without
or with a wrong token, and predictions on the published runtime ports with the token.

Then, on the same converged nodes, `torchfleet rollout aws-dev` with the fleet.json the demo
wrote, a real Prometheus (Debian's, on loopback, scraping the three nodes every second with the
API token) as the guards' figures, and a bounded client load through HAProxy's HTTPS listener
during each rollout; the candidates are TorchScript files of the demo model's family that the
container runtimes load:
- a good candidate is promoted through every step to 100 % with no failed client request;
- a candidate that answers 5xx is rolled back by the error guard, a several-times slower one by
  the p99 guard: the failed requests stay within the canary's share of those sent while it was in
  the rotation, and none fail after the rollback;
- a candidate whose outputs differ is found by a shadow test while every client answer stays
  the stable model's.
The bad candidates misbehave only on the clients' requests (first value TRIGGER), never on the
runtime's warm-up samples, so every file loads, warms and is served, as a bad build would be.

The ONE test module that converges nodes from scratch (minutes, once for all its tests through a
module-scoped fixture): it runs `torchfleet demo`'s code with its own container prefix (a random
suffix, so it never meets a developer's demo) and removes everything it made, also when it
fails. Run with -s to see the demo's progress and the rollouts' timelines."""

from __future__ import annotations

import hashlib
import io
import json
import re
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from live_fleet import (
    Load,
    check_promoted,
    check_rolled_back,
    check_shadow_differs,
    prometheus,
    rollout,
    under_load,
    versions,
)

from infra import client
from infra.deploy import containers, demo, pipeline
from infra.deploy.progress import Console
from infra.deploy.stage import EXIT_OK, EXIT_ROLLED_BACK
from infra.deploy.summary import Summary
from infra.rollout.local import LocalFleet

torch = pytest.importorskip("torch")

NODES = 3
STACK = demo.SHAPE_STACK
TRIGGER = 1.0  # the first value of the clients' requests; warm-up's random samples never are
SLOW_PASSES = 6  # the slow candidate runs the model this many more times on a client's request
# Windows of 4 s over scrapes every second; the p99 guard ignores differences under 50 ms and
# the capacity guard only a halving (a 2-core machine shared by three nodes, HAProxy, Prometheus
# and the clients is noisy: a node's warm-up timings, the capacity figure, with it).
ROLLOUT = [
    *("--bake", "8s", "--window", "4s"),
    *("--guard", "min_requests=5", "--guard", "min_p99_increase_s=0.05"),
    *("--guard", "min_capacity_ratio=0.5"),
]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


@dataclass
class DemoFleet:
    prefix: str
    result: demo.DemoResult
    out: str  # the demo's own progress
    inventory: dict
    status: Summary
    local: LocalFleet

    @property
    def state(self) -> Path:
        return demo.state_dir(self.prefix)


@pytest.fixture(scope="module")
def fleet() -> Iterator[DemoFleet]:
    missing = containers.missing_tools("podman", "runc", "ssh", "ssh-keygen", "haproxy")
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run `make setup`")
    prefix = f"torchfleet-demo-e2e{uuid.uuid4().hex[:6]}-"
    out = io.StringIO()
    console = Console(out, live=False)
    try:
        try:
            result = demo.run(console, prefix, NODES, bench=False, plan=False)
            inventories = demo.state_dir(prefix) / "inventories"
            inventory = yaml.safe_load((inventories / STACK / "stack.yml").read_text())
            # `torchfleet status`'s look at the nodes, on the same converged nodes
            status = pipeline.status_of(
                STACK, result.summary.outputs, result.summary.cfg, inventories, None
            )
        finally:
            print(out.getvalue())  # the demo's own progress, in the log of a failing run
            console.close()
        yield DemoFleet(
            prefix,
            result,
            out.getvalue(),
            inventory,
            status,
            LocalFleet.load(demo.fleet_dir(prefix)),
        )
    finally:
        demo.clean(Console(io.StringIO(), live=False), prefix)


def test_demo_converges_container_nodes_and_predicts_through_the_endpoint(fleet):
    result, out = fleet.result, fleet.out
    nodes = result.nodes
    assert len(nodes) == NODES
    summary = "\n".join(result.summary.lines())
    endpoint = result.summary.outputs["endpoint"]
    assert re.fullmatch(r"https://localhost:\d+/", endpoint), endpoint
    assert re.search(
        rf"prediction  POST {re.escape(endpoint)}v1/predict \(direct\) -> 200 in \d+ ms: "
        r"1 output\(s\) of 10 value\(s\)",
        summary,
    ), summary
    # the load balancer: auth on, plain HTTP only redirects, every node a healthy backend
    assert result.balancer_codes == {
        "no token": 401,
        "wrong token": 401,
        "the token": 200,
        "http": 301,
    }
    assert re.search(r"TLSv1\.[23], certificate verified", out), out
    for node in nodes:
        assert f"haproxy backend runtimes/{node.name}: UP" in out
    for i in range(NODES):
        assert re.search(rf"aws-dev-gpu-{i} +127\.0\.0\.1 +ready, batch cap \d+", summary), summary
    assert result.prediction_codes == [200, 200] * NODES  # JSON and binary on each published port
    assert "site.yml: changed=" in out and "verify.yml" in out

    # the converge read the stack output's inventory: the program's hosts, every variable of them
    program = demo.stack_outputs(NODES)["inventory"]["all"]["children"]["gpu_nodes"]["hosts"]
    hosts = fleet.inventory["all"]["children"]["gpu_nodes"]["hosts"]
    assert set(program) == set(hosts) == {f"aws-dev-gpu-{i}" for i in range(NODES)}
    for (name, host), node in zip(sorted(hosts.items()), nodes, strict=True):
        assert set(program[name]) <= set(host)
        assert (host["ansible_port"], host["private_ip"]) == (node.ssh_port, node.ip)

    assert len(fleet.status.nodes) == NODES
    for seen in fleet.status.nodes:
        assert seen.ready and seen.model["max_batch_size"] >= 1 and seen.model["device"] == "cpu"


def test_the_demo_describes_a_fleet_the_rollout_command_moves(fleet):
    """fleet.json: the nodes behind the load balancer, each serving the file at its model path
    on this machine (the mounted model directory), with its shadow path beside it and the
    runtime's admin API on; the tokens in files only their owner reads, and in no log."""
    local = fleet.local
    assert local.nodes() == [n.name for n in fleet.result.nodes]
    assert local.urls() == {n.name: n.url for n in fleet.result.nodes}
    assert local.balancer.https_port == int(
        fleet.result.summary.outputs["endpoint"][:-1].rsplit(":", 1)[1]
    )
    served = set()
    for name in local.nodes():
        path, version = local.serving(name)
        assert path.is_file() and path.with_suffix(".json").is_file(), path
        served.add((version, json.loads(path.with_suffix(".json").read_text())["version"]))
        card = client.get_json(client.Target.parse(local.urls()[name], local.auth), "/v1/model", 10)
        assert card["shadow"] is None  # a path, no file: no shadow test runs
    # each node generated its own file, and all report the one version its sidecar declares:
    # the guards compare the candidate with the stable version on every other node
    ((version, declared),) = served
    assert version == declared and version.startswith("demo-"), served
    for secret in (local.folder / "fleet.json", local.admin_token_file, fleet.state / "api-token"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    tokens = [local.admin_token_file.read_text().strip(), local.auth.token]
    assert all(tokens) and tokens[0] != tokens[1]
    logs = {"the demo's output": fleet.out}
    for path in (fleet.state / "runs").rglob("*"):
        if path.is_file():
            logs[str(path)] = path.read_text(errors="replace")
    leaks = [where for where, text in logs.items() if any(t in text for t in tokens)]
    assert leaks == [], "a token is in these logs (not shown here)"
    # the admin API takes the admin token only (the command's reload is tested by the rollouts)
    url = local.urls()[local.nodes()[0]] + "/admin/reload"
    wrong = client.request("POST", url, b"", {"Authorization": f"Bearer {tokens[1]}"})[0]
    assert wrong == 401  # 403 would mean the admin API is off


# --- the candidates ---------------------------------------------------------------------------


class Candidate(torch.nn.Module):
    """The demo model, and on a client's request (first value TRIGGER) per `mode`: 0 nothing
    else, 1 a failure (the runtime answers 500), 2 `passes` more runs of the model, one after
    the other (the same answer, several times slower)."""

    def __init__(self, mode: int, passes: int = 0) -> None:
        super().__init__()
        from torchfleet_runtime.demo import build_demo_model

        self.inner = build_demo_model()
        self.mode = mode
        self.passes = passes
        self.trigger = TRIGGER

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        if self.mode == 0 or not bool((x[:, 0, 0, 0] == self.trigger).any()):
            return y
        if self.mode == 1:
            raise RuntimeError("this model version is broken")
        for _ in range(self.passes):
            # each pass takes the last one's answer (a change far below float32's resolution),
            # so no optimisation of the loaded file merges the passes into one
            y = self.inner(x + y.mean() * 1e-30)
        return y


def _other_weights() -> torch.nn.Module:
    """The demo model with its classifier's rows rotated by one: every answer's argmax moves."""
    from torchfleet_runtime.demo import build_demo_model

    model = build_demo_model()
    with torch.no_grad():
        model.fc.weight.copy_(model.fc.weight.roll(1, 0))
        model.fc.bias.copy_(model.fc.bias.roll(1, 0))
    return model


def _save(module: torch.nn.Module, path: Path, version: str) -> str:
    """A TorchScript file with the demo model's sidecar and its own version: its reference."""
    from torchfleet_runtime.demo import metadata

    torch.jit.script(module.eval()).save(str(path))
    path.with_suffix(".json").write_text(json.dumps({**metadata(), "version": version}))
    return f"{path}@sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"


@pytest.fixture(scope="module")
def candidates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("candidates")
    return {
        "good": _save(Candidate(0), folder / "good.pt", "v2"),
        "errors": _save(Candidate(1), folder / "errors.pt", "bad-errors"),
        "slow": _save(Candidate(2, SLOW_PASSES), folder / "slow.pt", "bad-slow"),
        "weights": _save(_other_weights(), folder / "weights.pt", "bad-weights"),
    }


# --- the load and the figures -----------------------------------------------------------------


def _request() -> tuple[bytes, dict[str, str], torch.Tensor]:
    """One instance as a raw float32 body (first value TRIGGER) and the stable model's answer."""
    from torchfleet_runtime.demo import INPUT_SHAPE, build_demo_model

    x = torch.randn((1, *INPUT_SHAPE), generator=torch.Generator().manual_seed(7))
    x[0, 0, 0, 0] = TRIGGER
    headers = {
        "Content-Type": "application/octet-stream",
        "X-Shape": ",".join(str(d) for d in x.shape),
        "X-Dtype": "float32",
    }
    with torch.no_grad():
        expected = build_demo_model()(x)
    return x.numpy().astype("<f4").tobytes(), headers, expected


def _load(fleet: DemoFleet) -> Load:
    body, headers, expected = _request()

    def stable(answer: bytes) -> bool:
        outputs = torch.tensor(json.loads(answer)["outputs"])
        return outputs.shape == expected.shape and torch.allclose(
            outputs, expected, rtol=1e-3, atol=1e-3
        )

    lb = fleet.local.balancer
    return Load(
        lb.https_port, str(lb.certificates.ca), body, headers, stable, token=fleet.local.auth.token
    )


@pytest.fixture(scope="module")
def figures(fleet: DemoFleet) -> Iterator[str]:
    """Debian's Prometheus scraping the three nodes' /metrics on their published ports every
    second, with the API token from its file."""
    targets = [u.removeprefix("http://") for u in fleet.local.urls().values()]
    with prometheus(fleet.state / "prometheus", targets, fleet.state / "api-token") as url:
        yield url


def _rollout(fleet: DemoFleet, figures: str, *args: str) -> int:
    return rollout(STACK, fleet.local.folder, "--prometheus", figures, *ROLLOUT, *args)


def test_a_good_candidate_is_promoted_through_every_step(fleet, candidates, figures, capsys):
    load = _load(fleet)
    args = ("--model", candidates["good"], "--strategy", "linear", "--steps", "34,67,100")
    code, began, ended = under_load(load, lambda: _rollout(fleet, figures, *args), 1.0)
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    check_promoted(fleet.local, load, out, "v2", steps=3)
    print(f"good: {load.sent()} requests, 0 failed, promoted in {ended - began:.1f} s\n{out}")


@pytest.mark.parametrize(("mode", "guard"), [("errors", "error_ratio"), ("slow", "p99")])
def test_a_bad_candidate_is_rolled_back_by_its_guard(
    fleet, candidates, figures, capsys, mode, guard
):
    stable = fleet.local.state().read()["stable"]["version"]
    load = _load(fleet)
    args = ("--model", candidates[mode])
    code, began, ended = under_load(load, lambda: _rollout(fleet, figures, *args), 2.0)
    out = capsys.readouterr().out
    assert code == EXIT_ROLLED_BACK, out
    failed, during = check_rolled_back(
        fleet.local, load, out, guard, stable, (began, ended), answers_5xx=mode == "errors"
    )
    print(
        f"{mode}: {failed} of {during} requests failed during the rollout, none after; "
        f"rolled back in {ended - began:.1f} s\n{out}"
    )


def test_shadow_finds_the_differing_model_without_any_client_seeing_it(
    fleet, candidates, figures, capsys
):
    before = versions(fleet.local)
    load = _load(fleet)
    args = ("--model", candidates["weights"], "--strategy", "shadow")
    code, began, ended = under_load(load, lambda: _rollout(fleet, figures, *args), 1.0)
    out = capsys.readouterr().out
    assert code == EXIT_ROLLED_BACK, out
    shadow = check_shadow_differs(fleet.local, load, out, before)
    print(
        f"shadow: {load.sent()} requests, 0 failed, 0 wrong, decided in {ended - began:.1f} s: "
        f"{shadow['compared_instances']:.0f} instances compared, argmax agreement "
        f"{shadow['argmax_agreement']:.2f}\n{out}"
    )


def test_clean_removes_everything(fleet):
    endpoint = fleet.result.summary.outputs["endpoint"]
    demo.clean(Console(io.StringIO(), live=False), fleet.prefix)
    assert containers.list_nodes(fleet.prefix) == []
    assert not demo.state_dir(fleet.prefix).exists()
    assert not (fleet.local.folder / "fleet.json").exists()
    assert client.request("GET", endpoint.replace("https", "http"), timeout=2)[0] is None
