"""A group-mode weight step as a targeted update (infra/deploy/split.py): aws-prod's program
under the mock engine stands for the cloud. `AppliedStack` is the Automation API's Stack with a
state: a whole `up` applies every resource the program registers, a targeted one only its
targets, as Pulumi's engine does, so a target left out shows as a resource whose applied inputs
differ from the program's. The endpoint is a loopback server that answers the smoke
prediction; no preflight may run."""

from __future__ import annotations

import http.server
import io
import json
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from aws_prod_stack import (
    BUCKET,
    CAND_SHA,
    ROLLED_BACK,
    STABLE_SHA,
    FakeStack,
    Windows,
    candidate_ref,
    cloud_split,
)
from pulumi import automation as auto
from torchfleet_bench.rollout_step import MockEngineStack

from infra import config
from infra.config import RolloutSplit
from infra.deploy import preflight, split
from infra.deploy.automation import Outputs
from infra.deploy.progress import Console
from infra.deploy.stage import StageError
from infra.matrix import REPO_ROOT
from infra.rollout.cloud import KEY, CloudSplit
from infra.rollout.state import RolloutState
from infra.stacks import load_stack_config

STACK = "aws-prod"
CAND, STABLE = f"{CAND_SHA}.pt", f"{STABLE_SHA}.pt"


class Endpoint(http.server.BaseHTTPRequestHandler):
    """The load balancer: a model card, and `predict_status` to each prediction."""

    predict_status = 200
    predictions: list[str] = []

    def do_GET(self) -> None:
        self._answer(200, {"input_shape": [3], "dtype": "float32"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Endpoint.predictions.append(self.path)
        self._answer(self.predict_status, {"outputs": [[0.5, 0.5]]})

    def _answer(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    Endpoint.predictions, Endpoint.predict_status = [], 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class AppliedStack(MockEngineStack):
    """aws-prod with a `rollout` block; `applied`: each resource's inputs as the last `up` that
    targeted it (or a whole `up`) left them."""

    def __init__(self, block: dict[str, Any], endpoint: str) -> None:
        doc = yaml.safe_load((REPO_ROOT / f"Pulumi.{STACK}.yaml").read_text())
        super().__init__(STACK, {**doc["config"], KEY: block}, endpoint)
        self.applied: dict[str, dict[str, Any]] = {}
        self.calls: list[dict[str, Any]] = []

    def plan(self) -> dict[str, dict[str, Any]]:
        """What the program declares for the current config, compared as the step compares."""
        return {r.urn: split._comparable(r.inputs) for r in self.run().resources}

    def up(self, target: list[str] | None = None, **kw: Any) -> auto.UpResult:
        self.calls.append({"target": target, **kw})
        declared = self.plan()
        for urn in declared if target is None else target:
            if urn in declared:
                self.applied[urn] = declared[urn]
            else:
                self.applied.pop(urn, None)
        return auto.UpResult(stdout="", stderr="", summary=None, outputs=self.outputs())


@pytest.fixture
def guarded(monkeypatch) -> list[str]:
    """No preflight may run; the readiness stage's calls recorded (it is tested with moto in
    tests/deploy/test_readiness.py), the smoke stage real."""
    waits: list[str] = []

    def refuse(*args: Any, **kw: Any) -> None:
        raise AssertionError("a targeted step ran the preflight")

    monkeypatch.setattr(preflight, "run", refuse)
    monkeypatch.setattr(
        split.readiness, "wait_group", lambda stack, cloud, outputs, *a, **kw: waits.append(cloud)
    )
    return waits


def _step(stack: AppliedStack) -> split.TargetedStep:
    raw = {k.split(":", 1)[1]: v for k, v in stack.values.items()}
    return split.TargetedStep(STACK, stack, config.load(raw, STACK), Console(io.StringIO()))


def _no_whole_up() -> None:
    raise AssertionError("a weight step ran the whole `up` pipeline")


def _names(urns: list[str] | None) -> list[str]:
    return sorted(u.rsplit("::", 1)[1] for u in urns or [])


def test_a_weight_step_updates_the_listener_alone_then_checks_readiness_and_smoke(
    endpoint, guarded
):
    stack = AppliedStack(
        {"candidate_weight": 10, "candidate_model": CAND, "stable_model": STABLE}, endpoint
    )
    stack.up()  # the stack as the step before left it
    cloud = CloudSplit(stack, _no_whole_up, tracks=None, say=lambda _: None, step=_step(stack))  # type: ignore[arg-type]
    cloud.set_weights({"candidate": 50, "stable": 150})  # 25 %
    (call,) = stack.calls[1:]
    assert _names(call["target"]) == ["fleet-https"] and call["target_dependents"] is True
    assert call["message"] == "torchfleet rollout: the split"
    # what was applied is what the program declares for the new split: nothing left behind
    assert stack.applied == stack.plan()
    (listener,) = [v for u, v in stack.applied.items() if u.endswith("::fleet-https")]
    weights = sorted(g["weight"] for g in listener["defaultActions"][0]["forward"]["targetGroups"])
    assert weights == [25, 75]
    assert guarded == ["aws"] and Endpoint.predictions == ["/v1/predict"]


def test_the_first_split_creates_the_candidate_group_by_its_targets(endpoint, guarded):
    stack = AppliedStack(
        {"candidate_weight": 0, "candidate_model": CAND, "stable_model": STABLE}, endpoint
    )
    stack.up()
    before = dict(stack.applied)
    cloud = CloudSplit(stack, _no_whole_up, tracks=None, say=lambda _: None, step=_step(stack))  # type: ignore[arg-type]
    cloud.set_weights({"candidate": 20, "stable": 180})  # 10 %
    assert _names(stack.calls[-1]["target"]) == [
        "fleet-candidate-asg",
        "fleet-candidate-launch-hook",
        "fleet-candidate-lt",
        "fleet-candidate-terminate-hook",
        "fleet-https",
        "fleet-node-leave-candidate",
        "fleet-node-lifecycle",
    ]
    assert stack.applied == stack.plan()
    # every resource outside the split is as it was
    assert {u: v for u, v in stack.applied.items() if u not in stack.calls[-1]["target"]} == {
        u: v for u, v in before.items() if u not in stack.calls[-1]["target"]
    }
    # back to 0 %: the candidate group and its family are deleted by their targets
    cloud.set_weights({"candidate": 0, "stable": 200})
    assert stack.applied == stack.plan()
    assert not [u for u in stack.applied if "candidate-asg" in u]


def test_a_step_that_changes_nothing_runs_no_pulumi_up(endpoint, guarded):
    stack = AppliedStack(
        {"candidate_weight": 10, "candidate_model": CAND, "stable_model": STABLE}, endpoint
    )
    step = _step(stack)
    assert step(stack.get_all_config()) is None
    assert stack.calls == [] and guarded == [] and Endpoint.predictions == []


def test_a_failed_smoke_stops_the_step_with_the_stage_error(endpoint, guarded):
    stack = AppliedStack(
        {"candidate_weight": 10, "candidate_model": CAND, "stable_model": STABLE}, endpoint
    )
    stack.up()
    Endpoint.predict_status = 500
    cloud = CloudSplit(stack, _no_whole_up, tracks=None, say=lambda _: None, step=_step(stack))  # type: ignore[arg-type]
    with pytest.raises(StageError) as err:
        cloud.set_weights({"candidate": 50, "stable": 150})
    assert err.value.stage == "smoke" and "answered 500" in err.value.message


class TargetedFake(FakeStack):
    """test_group_rollout's aws-prod stack (each `up` records what the program declares), whose
    `up` also records whether it was targeted."""

    def __init__(self, block: dict | None = None) -> None:
        super().__init__(block)
        self.targeted: list[bool] = []
        self.workspace = SimpleNamespace(env_vars={})

    def up(self, target: list[str] | None = None, **kw: Any) -> auto.UpResult:  # type: ignore[override]
        self.targeted.append(target is not None)
        super().up()
        return auto.UpResult(stdout="", stderr="", summary=None, outputs=self.outputs())


def test_a_failing_candidate_rolls_back_as_before_with_targeted_weight_steps(
    tmp_path,
    s3,
    monkeypatch,
    canary_engine,
    guarded,
    endpoint,
):
    """test_group_rollout's rolled-back canary with the targeted step: the same states, one per
    `up` (the weight steps targeted, the model placements whole), the same end."""
    s3.put_object(Bucket=BUCKET, Key=f"models/{STABLE}", Body=b"stable model")
    stack = TargetedFake({"candidate_weight": 0, "stable_model": STABLE})
    cloud = cloud_split(tmp_path, stack, s3)
    raw = {k.split(":", 1)[1]: v for k, v in stack.values.items()}
    cloud.step = split.TargetedStep(STACK, stack, config.load(raw, STACK), Console(io.StringIO()))
    monkeypatch.setattr(
        split.automation,
        "outputs",
        lambda name, opener: Outputs({**stack.outputs_of_up, "endpoint": endpoint}),
    )
    result = canary_engine(cloud, Windows(cand_errors=30)).start(candidate_ref(tmp_path))
    assert result == "rolled_back"
    assert stack.ups == ROLLED_BACK
    # the candidate's file placed (whole `up`), 10 % (targeted), out at once (targeted), the
    # candidate track back on the stable's file (whole `up`)
    assert stack.targeted == [False, True, True, False]
    assert stack.values[KEY]["candidate_weight"] == 0
    assert RolloutState(tmp_path / "rollout.json").read()["status"] == "rolled_back"
    # each targeted step guarded by readiness and a prediction through the endpoint
    assert guarded == ["aws", "aws"] and Endpoint.predictions == ["/v1/predict"] * 2


def test_on_alibaba_a_step_between_two_shares_targets_the_candidates_vserver_weight():
    """alicloud-prod: the split is the candidate ESS group's weight in the one VServer group
    (ESS re-attaches that group to apply it); nothing of the stable group is targeted."""
    ali = "alicloud-prod"
    values = {
        **load_stack_config(ali),
        "torchfleet:model_bucket": BUCKET,
        KEY: {"candidate_weight": 10, "candidate_model": CAND, "stable_model": STABLE},
    }
    stack = MockEngineStack(ali, values, "http://127.0.0.1:9/")
    raw = {k.split(":", 1)[1]: v for k, v in values.items()}
    cfg = config.load(raw, ali)
    step = split.TargetedStep(ali, stack, cfg, Console(io.StringIO()))
    before = stack.get_all_config()
    stack.values[KEY] = {**stack.values[KEY], "candidate_weight": 25}
    targets = step.targets(before)
    assert _names(targets) == ["fleet-candidate-group-backends"]
    (attach,) = [
        r
        for r in step.plan(split.config_values(stack.get_all_config())).resources
        if r.urn == targets[0]
    ]
    weights = [g["weight"] for g in attach.inputs["vserverGroups"][0]["vserverAttributes"]]
    want = RolloutSplit(candidate_weight=25).backend_weight(cfg.nodes.min, cfg.nodes.max)
    was = RolloutSplit(candidate_weight=10).backend_weight(cfg.nodes.min, cfg.nodes.max)
    assert weights == [want] and want != was
