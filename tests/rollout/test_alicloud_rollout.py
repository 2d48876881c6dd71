"""`torchfleet rollout` on an Alibaba group stack, end to end without a cloud: the command over
alicloud-prod, its fake stack's `up` running the real program under the mock engine; the
model files placed in OSS and the stable group rolled through ESS, both through the official
SDKs against the loopback fake that checks every signature (tests/bootstrap/fake_alibaba.py),
which keeps the bucket and answers as the stable scaling group (tests/rollout/ess_sim.py). Each
`up` makes the stable group's scaling configuration the one the program declares, as ESS does
when Pulumi replaces it; the promotion's roll then has to move every running node onto it.

- a good candidate: the split grows (one candidate node at 10 %, then at the "100 %" step the
  most the VServer group's weights reach beside the stable minimum, 80 %), the stable group's
  configuration moves to the candidate's model and every running stable node is replaced,
  never fewer in service, before the candidate group leaves;
- a 5xx candidate: rolled back at 10 %, the stable nodes never touched;
- no --prometheus: the guards read the nodes' own figures in CloudMonitor (the CLB's are per
  listener), which the node agent publishes (tests/rollout/cms_sim.py keeps them), held against
  the CLB's own totals: a figure one node forged pauses the rollout instead of moving it."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import time
from functools import partial
from pathlib import Path

import pytest
import yaml
from cms_sim import ACTIONS as CMS_ACTIONS
from cms_sim import CmsSim
from ess_sim import EssSim
from fake_alibaba import FakeAlibaba, role_credentials  # tests/rollout/conftest.py: importable
from fixed_windows import FixedWindows
from pulumi import automation as auto

from infra.bootstrap.torchfleet_agent import boot
from infra.bootstrap.torchfleet_agent.cloud import cloud_of
from infra.cli import main
from infra.config import RolloutSplit
from infra.matrix import REPO_ROOT
from infra.offline import FAKE_ALI_ACCOUNT, run_offline
from infra.rollout import clouds, command, refresh, signals
from infra.rollout.cloud import KEY
from infra.rollout.engine import Rollout
from infra.rollout.state import RolloutState

STACK = "alicloud-prod"
BUCKET = "example-torchfleet-models"
STABLE_GROUP = "torchfleet-alicloud-prod-ess"
CANDIDATE_GROUP = "torchfleet-alicloud-prod-candidate-ess"
ESS = "alicloud:ess/scalingGroup:ScalingGroup"
ESS_CONFIG = "alicloud:ess/scalingConfiguration:ScalingConfiguration"
ATTACH = "alicloud:ess/scalingGroupVServerGroups:ScalingGroupVServerGroups"
STABLE_BYTES, CAND_BYTES = b"stable model", b"candidate model"
# a node's metadata service: its RAM role's credentials (the node agent publishes with them)
METADATA = {
    "ram/security-credentials/": "torchfleet-node",
    "ram/security-credentials/torchfleet-node": role_credentials(),
}
STABLE_SHA = hashlib.sha256(STABLE_BYTES).hexdigest()
CAND_SHA = hashlib.sha256(CAND_BYTES).hexdigest()


def _model(node_config: dict) -> str | None:
    model = node_config.get("model")
    if model is None:
        return None
    digest = model["checksum"].removeprefix("sha256:")
    assert model["source"] == f"oss://{BUCKET}/models/{digest}.pt"
    return str(digest)


class FakeStack:
    """The Automation API's Stack as the split uses it. `up` runs alicloud-prod offline, makes
    the stable configuration it declares the sim's active one, and records (candidate nodes,
    candidate model, stable model, candidate weight per node)."""

    def __init__(self, sim: EssSim, block: dict) -> None:
        doc = yaml.safe_load((REPO_ROOT / f"Pulumi.{STACK}.yaml").read_text())
        self.values: dict[str, object] = {
            **doc["config"],
            "torchfleet:model_bucket": BUCKET,
            KEY: block,
        }
        self.sim = sim
        self.ups: list[tuple[int, str | None, str | None, int]] = []
        self.outputs_of_up: dict[str, object] = {}

    def outputs(self) -> dict[str, auto.OutputValue]:
        return {k: auto.OutputValue(v, False) for k, v in self.outputs_of_up.items()}

    def get_all_config(self) -> dict[str, auto.ConfigValue]:
        return {
            k: auto.ConfigValue(v if isinstance(v, str) else json.dumps(v))
            for k, v in self.values.items()
        }

    def set_config(self, key: str, value: auto.ConfigValue, *, path: bool = False) -> None:
        self.values[key] = json.loads(value.value)

    def up(self) -> None:
        run = run_offline(STACK, dict(self.values))
        self.outputs_of_up = dict(run.outputs)
        names = {f"{g.name}-id": g.inputs["scalingGroupName"] for g in run.of_type(ESS)}
        configs = {names[c.inputs["scalingGroupId"]]: c.inputs for c in run.of_type(ESS_CONFIG)}
        weights = {
            names[a.inputs["scalingGroupId"]]: int(
                a.inputs["vserverGroups"][0]["vserverAttributes"][0]["weight"]
            )
            for a in run.of_type(ATTACH)
        }
        groups = {g.inputs["scalingGroupName"]: g.inputs for g in run.of_type(ESS)}
        stable = configs[STABLE_GROUP]
        self.sim.active = "scfg-" + hashlib.sha256(stable["userData"].encode()).hexdigest()[:10]
        cand = groups.get(CANDIDATE_GROUP)

        def model_of(group: str) -> str | None:
            return _model(_node_config(configs[group]))

        self.ups.append(
            (
                int(cand["desiredCapacity"]) if cand else 0,
                model_of(CANDIDATE_GROUP) if cand else None,
                model_of(STABLE_GROUP),
                weights.get(CANDIDATE_GROUP, 0),
            )
        )


def _node_config(inputs: dict) -> dict:
    doc = yaml.safe_load(base64.b64decode(inputs["userData"]).decode())
    (entry,) = [f for f in doc["write_files"] if f["path"] == boot.CONFIG]
    return dict(json.loads(entry["content"]))


# no sidecars: each file's model_version is its digest
Windows = partial(FixedWindows, "sha256:" + STABLE_SHA[:12], "sha256:" + CAND_SHA[:12])


@pytest.fixture
def cloud(monkeypatch, tmp_path, alibaba_keys):
    """The fake Alibaba (OSS + the stable ESS group of 2 nodes, alicloud-prod's minimum, on a
    configuration older than any `up`), the operator's keys, the command's endpoints on it."""
    monkeypatch.setenv("TORCHFLEET_PRICES", "offline")
    monkeypatch.setattr(command, "FLEETS", tmp_path / "fleets")
    sim, cms = EssSim(STABLE_GROUP, 2, max_size=6), CmsSim(FAKE_ALI_ACCOUNT)

    def answer(action: str, params: dict[str, str]) -> dict:
        return (cms if action in CMS_ACTIONS else sim).answer(action, params)

    with FakeAlibaba(answer, METADATA) as fake:
        fake.cms = cms  # type: ignore[attr-defined]
        fake.objects[(BUCKET, f"models/{STABLE_SHA}.pt")] = STABLE_BYTES
        monkeypatch.setenv("ALICLOUD_ESS_ENDPOINT", fake.url)
        monkeypatch.setenv("ALICLOUD_OSS_ENDPOINT", fake.url)
        monkeypatch.setenv("ALICLOUD_CMS_ENDPOINT", fake.url)
        # no real time passes between the roll's polls
        monkeypatch.setattr(clouds, "EssRoll", partial(refresh.EssRoll, sleep=lambda s: None))
        yield fake, sim


def _run(
    stack: FakeStack,
    monkeypatch,
    tmp_path,
    windows,
    prometheus: str = "x",
    bake: str = "0.01s",
    window: str | None = "0.01s",
):
    from infra.deploy import preflight
    from infra.rollout import command as cmd

    raw = {k.split(":", 1)[1]: v for k, v in stack.values.items()}
    from infra import config

    cfg = config.load(raw, STACK)
    monkeypatch.setattr(cmd.automation, "open_stack", lambda name: stack)
    monkeypatch.setattr(preflight, "check_config", lambda name: (None, cfg))
    monkeypatch.setattr(cmd, "PrometheusSource", lambda url, selector: windows)
    cand = tmp_path / "cand.pt"
    cand.write_bytes(CAND_BYTES)
    args = argparse.Namespace(
        words=[STACK],
        model=f"{cand}@sha256:{CAND_SHA}",
        strategy="canary",
        steps=None,
        bake=bake,
        window=window,
        guard=[],
        prometheus=prometheus or None,
        selector="",
        fleet=None,
    )
    out: list[str] = []
    # every config change through the fake stack's whole `up` (the targeted weight step is
    # tests/rollout/test_targeted_step.py's)
    code = command.run(
        args, out.append, up_of=lambda name: stack.up, step_of=lambda *_: lambda before: stack.up()
    )
    return code, "\n".join(out)


def test_a_good_candidate_is_promoted_and_every_running_stable_node_rolled(
    cloud, monkeypatch, tmp_path
):
    fake, sim = cloud
    old_nodes = set(sim.nodes)
    stack = FakeStack(sim, {"candidate_weight": 0, "stable_model": f"{STABLE_SHA}.pt"})
    code, out = _run(stack, monkeypatch, tmp_path, Windows())
    assert code == 0, out
    top = RolloutSplit.max_backend_share(2, 6)
    assert top == 80  # alicloud-prod: min 2, max 6 (docs/rollouts.md)
    assert "candidate_weight = 80" in out
    promoted_config = sim.active
    # the canary's one node at 10 %, then 4 candidate nodes at weight 100 (80 %) while the
    # stable group moves to the candidate's model; its roll; then no candidate group
    assert stack.ups[1:] == [
        (1, CAND_SHA, STABLE_SHA, RolloutSplit(10).backend_weight(2, 6)),
        (4, CAND_SHA, STABLE_SHA, 100),
        (4, CAND_SHA, CAND_SHA, 100),
        (0, None, CAND_SHA, 0),
    ]
    serving = sim.serving()
    assert set(serving.values()) == {promoted_config} and len(serving) == 2
    assert not old_nodes & set(sim.nodes) and min(sim.in_service) >= 2
    assert fake.objects[(BUCKET, f"models/{CAND_SHA}.pt")] == CAND_BYTES
    assert fake.refused == []
    # the roll ran between the `up` that moved the stable model and the candidate group's end
    assert "node(s) in service on an older configuration" in out
    assert (
        out.index("stable_model =")
        < out.index("older configuration")
        < out.rindex("candidate_weight = 0")
    )
    doc = RolloutState(tmp_path / "fleets" / STACK / "rollout.json").read()
    assert doc["status"] == "promoted" and doc["stable"]["version"] == Windows().candidate


def test_a_failing_candidate_is_rolled_back_without_touching_the_stable_nodes(
    cloud, monkeypatch, tmp_path
):
    fake, sim = cloud
    nodes = dict(sim.nodes)
    stack = FakeStack(sim, {"candidate_weight": 0, "stable_model": f"{STABLE_SHA}.pt"})
    code, out = _run(stack, monkeypatch, tmp_path, Windows(cand_errors=30))
    assert code == 10, out
    assert "guard error_ratio" in out
    assert all(up[2] == STABLE_SHA for up in stack.ups) and stack.ups[-1][0] == 0
    assert set(sim.nodes) == set(nodes) and sim.removed == []
    assert not [c for c in fake.calls if c["action"] in ("ModifyScalingGroup", "RemoveInstances")]


def test_without_prometheus_the_guards_read_the_nodes_metrics_in_cloudmonitor(
    cloud, monkeypatch, tmp_path
):
    """No --prometheus: CloudMonitorSource over the stack's output rollout_metrics (as `up` left
    it). While the first window sleeps, one node of each track publishes what it answered
    through the node agent's own code (its RAM role's credentials from the fake's metadata
    service): the candidate 30 of 100 in 5xx, which the CLB's own backend 5xx agree with, so the
    canary's first window rolls it back. The engine's clock and sleep are fake; the source reads
    the minute the nodes published in."""
    fake, sim = cloud
    stack = FakeStack(sim, {"candidate_weight": 0, "stable_model": f"{STABLE_SHA}.pt"})
    _publish_at_first_sleep(fake, stack, monkeypatch, balancer_errors=30)
    code, out = _run(
        stack, monkeypatch, tmp_path, Windows(), prometheus="", bake="60s", window=None
    )
    assert code == 10, out
    assert out.startswith(
        f"rollout {STACK}: figures from CloudMonitor (the nodes' RequestCount, ErrorCount, "
        "LatencyP99 per scaling group, cn-shanghai): each window reads a 60 s period"
    ), out
    judged = [line for line in out.splitlines() if "step 1 10 %" in line]
    assert "100 req, 30.00 % 5xx" in judged[0] and "900 req, 0.00 % 5xx" in judged[0], out
    assert "error_ratio" in judged[0]
    # before the first step the probe had no figures (the rollout's first `up` exports the
    # tracks' dimensions): it says so and goes on
    assert "p99 guard: resolution unknown, no figures before the first step" in out, out
    assert fake.refused == []
    # what the source asked: each track's scaling group in the stack's application group
    asked = [c["params"] for c in fake.calls if c["action"] == "DescribeMetricList"]
    nodes = {a["MetricName"] for a in asked if a["Namespace"].startswith("acs_customMetric_")}
    assert nodes == {"RequestCount", "ErrorCount", "LatencyP99"}
    assert {a["Namespace"] for a in asked} == {
        f"acs_customMetric_{FAKE_ALI_ACCOUNT}",
        "acs_slb_dashboard",  # the CLB's own totals, which the nodes' are held against
    }
    assert stack.values[KEY]["candidate_weight"] == 0 and sim.removed == []


def balancer(cms: CmsSim, lb: str, requests: float, errors: float) -> None:
    """The CLB's own figures of the minute now: requests and backend 5xx, per second."""
    at = int(time.time() * 1000)
    cms.balancer(lb, "InstanceQps", at, requests / 60)
    cms.balancer(lb, "InstanceUpstreamCode5xx", at, errors / 60)


def _publish_at_first_sleep(fake, stack, monkeypatch, balancer_errors, each_sleep=None) -> None:
    """While the first window sleeps, one node of each track publishes what it answered through
    the node agent's own code (its RAM role's credentials from the fake's metadata service: the
    candidate 30 of 100 in 5xx), and the CLB's own figures are recorded (1000 requests,
    `balancer_errors` backend 5xx). The engine's clock and sleep are fake; the source reads the
    minute the nodes published in."""
    published: list[float] = []

    def traffic() -> None:
        dims = stack.outputs_of_up["rollout_metrics"]
        balancer(fake.cms, dims["load_balancer"], requests=1000, errors=balancer_errors)
        for track, requests, errors in (("stable", 900, 0), ("candidate", 100, 30)):
            node = cloud_of(
                {
                    "cloud": "alicloud",
                    "region": fake.region,
                    "group_id": dims["scaling_groups"][track],
                    "metrics_group_id": dims["metric_group"],
                    "endpoints": {"imds": fake.url, "cms": fake.url},
                }
            )
            node.put_metrics(
                {
                    "RequestCount": (requests, "Count"),
                    "ErrorCount": (errors, "Count"),
                    "LatencyP99": (0.05, "Seconds"),
                }
            )
        published.append(time.time())

    clock = [0.0]

    def sleep(s: float) -> None:
        if clock[0] == 0.0:
            traffic()
        clock[0] += s
        if each_sleep is not None:
            each_sleep()

    def now() -> float:  # a minute and a second after the minute the nodes published in
        # (before they publish, the resolution probe before the first step: nothing yet)
        at = published[0] if published else time.time()
        return (at // 60) * 60 + 60 + signals.CLOUDWATCH_DELAY_S + 1

    monkeypatch.setattr(command, "Rollout", partial(Rollout, clock=lambda: clock[0], sleep=sleep))

    class AtNow(signals.CloudMonitorSource):
        def __init__(self, *args, **kw) -> None:
            super().__init__(*args, clock=now, **kw)

    monkeypatch.setitem(
        clouds.CLOUDS, "alicloud", dataclasses.replace(clouds.CLOUDS["alicloud"], figures=AtNow)
    )


def test_a_forged_figure_alone_neither_rolls_back_nor_promotes(cloud, monkeypatch, tmp_path):
    """Any node may write any custom metric (cms:PutCustomMetric takes no resource), so one node
    of the stable group claims 30 5xx for the candidate track while the CLB's backends answered
    none: the window's totals disagree with the load balancer's, the rollout holds the split
    and pauses itself (no rollback, no promotion) until a person acts; here the operator aborts.
    With no forger, the same candidate's honest figures would pass (the CLB saw no 5xx)."""
    fake, sim = cloud
    stack = FakeStack(sim, {"candidate_weight": 0, "stable_model": f"{STABLE_SHA}.pt"})
    state_file = tmp_path / "fleets" / STACK / "rollout.json"
    sleeps = [0]

    def operator() -> None:  # a person reads the pause and aborts
        sleeps[0] += 1
        if RolloutState(state_file).read().get("status") == "paused" and sleeps[0] > 3:
            RolloutState(state_file).update(lambda d: d.update(control="abort"))
        assert sleeps[0] < 50, "the rollout neither paused nor ended"

    _publish_at_first_sleep(fake, stack, monkeypatch, balancer_errors=0, each_sleep=operator)
    code, out = _run(
        stack, monkeypatch, tmp_path, Windows(), prometheus="", bake="60s", window=None
    )
    assert "the nodes report 30 5xx, the load balancer saw 0 from its backends" in out, out
    assert "-> hold" in out and "paused" in out, out
    assert "guard error_ratio" not in out and "promoted" not in out, out
    assert "aborted by `torchfleet rollout abort`" in out, out  # the person, not the figure
    assert stack.values[KEY]["candidate_weight"] == 0 and sim.removed == []


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ([], "model_bucket is unset"),  # the example stack names no bucket for the copies
        (["--window", "30s"], "at least 60s with figures from CloudMonitor"),
    ],
)
def test_the_cli_refuses_the_example_stack_naming_the_key(capsys, monkeypatch, extra, says):
    monkeypatch.setattr(command, "FLEETS", Path("/nonexistent-fleets"))
    ref = f"/nonexistent.pt@sha256:{CAND_SHA}"
    assert main(["rollout", STACK, "--model", ref, *extra]) == 2
    out = capsys.readouterr().out
    assert says in out and "Traceback" not in out, out
