"""`torchfleet rollout` on a mode: kubernetes stack: the engine drives aws-k8s's two Deployments
through CloudSplit (the split: `candidate_weight` and `up`) and ModelTracks (which file each
Deployment serves: `candidate_model` / `stable_model` in the model volume). The fake stack's `up`
runs the real aws-k8s program under the mock engine and keeps what each Deployment got, so the
replicas and files asserted are the program's own. Also: the command's refusals (no
--prometheus, shadow, group/instances stacks) with their exit code."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from fixed_windows import FixedWindows
from pulumi import automation as auto

from infra.cli import main
from infra.matrix import REPO_ROOT
from infra.offline import run_offline
from infra.rollout import command
from infra.rollout.cloud import KEY, CloudSplit
from infra.rollout.ref import ModelRef
from infra.rollout.state import RolloutState
from infra.rollout.tracks import FolderVolume, ModelTracks, runtime_version

DEPLOYMENT = "kubernetes:apps/v1:Deployment"
STABLE_BYTES, CAND_BYTES = b"stable model", b"candidate model"


class FakeStack:
    """The Automation API's Stack as the split uses it; `up` runs aws-k8s offline and records
    (candidate replicas, candidate file, stable file) from the Deployments it registered."""

    def __init__(self, stack: str = "aws-k8s") -> None:
        self.stack = stack
        doc = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())
        self.values: dict[str, object] = doc["config"]
        self.ups: list[tuple[int, str | None, str]] = []
        self.shadows: list[str | None] = []  # the stable Deployment's shadow_model, per `up`

    def get_all_config(self) -> dict[str, auto.ConfigValue]:
        return {
            k: auto.ConfigValue(v if isinstance(v, str) else json.dumps(v))
            for k, v in self.values.items()
        }

    def set_config(self, key: str, value: auto.ConfigValue, *, path: bool = False) -> None:
        assert not path
        self.values[key] = json.loads(value.value)

    def up(self) -> None:
        run = run_offline(self.stack, dict(self.values))
        by_name = {d.inputs["metadata"]["name"]: d.inputs for d in run.of_type(DEPLOYMENT)}
        names = run.outputs["workload"]

        def model(d: dict) -> str:
            (c,) = d["spec"]["template"]["spec"]["containers"]
            return {v["name"]: v["value"] for v in c["env"]}["TORCHFLEET_MODEL"]

        cand = by_name.get(names["candidate_deployment"])
        (stable,) = by_name[names["deployment"]]["spec"]["template"]["spec"]["containers"]
        self.shadows.append(
            {v["name"]: v["value"] for v in stable["env"]}.get("TORCHFLEET_SHADOW_MODEL")
        )
        if cand is not None:  # the candidate's pods never run a shadow
            (c,) = cand["spec"]["template"]["spec"]["containers"]
            assert "TORCHFLEET_SHADOW_MODEL" not in {v["name"] for v in c["env"]}
        self.ups.append(
            (
                int(cand["spec"]["replicas"]) if cand else 0,
                model(cand).removeprefix("/models/") if cand else None,
                model(by_name[names["deployment"]]).removeprefix("/models/"),
            )
        )


def _setup(tmp_path: Path, stack_name: str = "aws-k8s"):
    volume = FolderVolume(tmp_path / "volume")
    volume.folder.mkdir()
    (volume.folder / "model.pt").write_bytes(STABLE_BYTES)
    cand = tmp_path / "cand.pt"
    cand.write_bytes(CAND_BYTES)
    stack = FakeStack(stack_name)
    tracks = ModelTracks(stack, stack.up, volume, say=lambda _: None)
    split = CloudSplit(stack, stack.up, tracks, cloud_limit=command.KUBERNETES_LIMIT, say=print)
    ref = ModelRef(str(cand), hashlib.sha256(CAND_BYTES).hexdigest())
    return stack, volume, split, ref


def _versions(tmp_path: Path) -> tuple[str, str]:
    stable, cand = tmp_path / "s.pt", tmp_path / "c.pt"
    stable.write_bytes(STABLE_BYTES)
    cand.write_bytes(CAND_BYTES)
    return runtime_version(stable), runtime_version(cand)


def test_a_canary_on_aws_k8s_moves_candidate_replicas_then_the_stable_deployments_model(
    tmp_path, canary_engine
):
    stack, volume, split, ref = _setup(tmp_path)
    stable_v, cand_v = _versions(tmp_path)
    assert canary_engine(split, FixedWindows(stable_v, cand_v)).start(ref) == "promoted"
    placed = f"{ref.sha256}.pt"
    assert (volume.folder / placed).read_bytes() == CAND_BYTES  # the checked copy, by digest
    # aws-k8s: replicas min 1, max 4. The block written (weight 0: no candidate pods), the
    # candidate file named, the canary's 10 % (one candidate pod beside the stable one), at
    # 100 % the candidate as large as replicas.max leaves (3) while the stable Deployment rolls
    # to the candidate's file, then no split: the stable Deployment serves the candidate's
    # model, the candidate has no pods
    assert stack.ups == [
        (0, "candidate.pt", "model.pt"),
        (0, placed, "model.pt"),
        (1, placed, "model.pt"),
        (3, placed, "model.pt"),
        (3, placed, placed),
        (0, placed, placed),
    ]
    block = stack.values[KEY]
    assert block == {"candidate_weight": 0, "candidate_model": placed, "stable_model": placed}
    doc = RolloutState(tmp_path / "rollout.json").read()
    assert doc["status"] == "promoted" and doc["stable"]["version"] == cand_v
    assert doc["previous"]["version"] == stable_v


def test_a_canary_on_alicloud_k8s_follows_its_replica_bounds(tmp_path, canary_engine):
    """ACK: the same program and split; replicas min 2, max 6, so the candidate is capped at 4
    pods beside the stable minimum. Its model volume is OSS (tests/rollout/test_oss_volume.py
    places and reads the copy through the SDK); a folder stands in for it here."""
    stack, volume, split, ref = _setup(tmp_path, "alicloud-k8s")
    stable_v, cand_v = _versions(tmp_path)
    assert canary_engine(split, FixedWindows(stable_v, cand_v)).start(ref) == "promoted"
    placed = f"{ref.sha256}.pt"
    assert stack.ups == [
        (0, "candidate.pt", "model.pt"),
        (0, placed, "model.pt"),
        (1, placed, "model.pt"),
        (4, placed, "model.pt"),
        (4, placed, placed),
        (0, placed, placed),
    ]


def test_a_failing_candidate_on_aws_k8s_goes_back_to_no_candidate_pods(tmp_path, canary_engine):
    stack, _, split, ref = _setup(tmp_path)
    stable_v, cand_v = _versions(tmp_path)
    windows = FixedWindows(stable_v, cand_v, cand_errors=30)
    assert canary_engine(split, windows).start(ref) == "rolled_back"
    placed = f"{ref.sha256}.pt"
    # the canary's pod, out at once (weight 0), then the candidate track back on the stable's
    # file (stored by digest); the stable Deployment never moved
    stable_copy = f"{hashlib.sha256(STABLE_BYTES).hexdigest()}.pt"
    assert stack.ups == [
        (0, "candidate.pt", "model.pt"),
        (0, placed, "model.pt"),
        (1, placed, "model.pt"),
        (0, placed, "model.pt"),
        (0, stable_copy, "model.pt"),
    ]
    assert stack.values[KEY]["candidate_weight"] == 0


@pytest.mark.parametrize(("agreement", "result"), [(1.0, "agrees"), (0.2, "differs")])
def test_a_shadow_test_on_aws_k8s_runs_on_the_stable_pods_and_ends(
    tmp_path, canary_engine, agreement, result
):
    """`--strategy shadow` on a kubernetes stack: the candidate placed in the model volume and
    named the stable Deployment's shadow_model (its rolling update loads it beside the model
    in each pod), judged by the shadow counts (the cluster's Prometheus: PrometheusSource's
    shadow), then removed again; the split and the served files never move."""
    stack, volume, split, ref = _setup(tmp_path)
    stable_v, cand_v = _versions(tmp_path)
    compared = [0.0]

    def counts() -> dict[str, tuple[float, float]]:
        compared[0] += 100.0
        return {cand_v: (compared[0], compared[0] * agreement)}

    assert canary_engine(split, FixedWindows(stable_v, cand_v)).shadow(ref, counts) == result
    placed = f"{ref.sha256}.pt"
    assert (volume.folder / placed).read_bytes() == CAND_BYTES
    assert stack.shadows == [f"/models/{placed}", None]  # set, then removed
    assert all(up == (0, "candidate.pt", "model.pt") for up in stack.ups)  # nothing else moved
    assert "shadow_model" not in stack.values[KEY]
    assert RolloutState(tmp_path / "rollout.json").read()["shadow"]["result"] == result


def test_runtime_version_is_what_the_runtime_reports(tmp_path):
    """The version the rollout predicts for a file is the one the runtime reports once it has
    loaded it (both call torchfleet_compat.model_version): by digest, then by sidecar."""
    import torch
    from torchfleet_runtime.config import load_config
    from torchfleet_runtime.model import load

    model = tmp_path / "m.pt"
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(model))
    cfg, _ = load_config({"model": str(model), "input_shape": "4", "device": "cpu"}, env={})
    assert runtime_version(model).startswith("sha256:")
    assert runtime_version(model) == load(cfg).version
    model.with_suffix(".json").write_text(json.dumps({"version": "2026-12-03.1"}))
    assert runtime_version(model) == load(cfg).version == "2026-12-03.1"


REF = "model.pt@sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["rollout", "aws-k8s", "--model", REF], "--prometheus URL is required"),
        (["rollout", "alicloud-k8s", "--model", REF], "CloudMonitor"),
        (
            ["rollout", "aws-prod", "--model", REF, "--window", "30s"],
            "--window = '30s' is invalid; allowed: at least 60s with figures from CloudWatch",
        ),
        (
            ["rollout", "aws-prod", "--model", REF, "--strategy", "shadow", "--prometheus", "x"],
            "--strategy shadow is not built on mode: group",
        ),
        (["rollout", "alicloud-prod", "--model", REF], "model_bucket is unset"),
        (["rollout", "aws-dev", "--model", REF], "mode: instances (aws)"),
    ],
)
def test_the_command_refuses_what_it_cannot_do_with_exit_2(argv, says, capsys, monkeypatch):
    monkeypatch.setattr(command, "FLEETS", Path("/nonexistent-fleets"))
    assert main(argv) == 2
    out = capsys.readouterr().out
    assert says in out and "Traceback" not in out, out


def test_status_of_a_kubernetes_rollout_reads_its_record(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(command, "FLEETS", tmp_path)
    RolloutState(tmp_path / "aws-k8s" / "rollout.json").write(
        {
            "status": "promoted",
            "stable": {"version": "v2", "sha256": "b" * 64},
            "candidate": None,
            "previous": {"version": "v1", "sha256": "a" * 64},
            "timeline": [],
        }
    )
    assert main(["rollout", "status", "aws-k8s"]) == 0
    assert "status promoted" in capsys.readouterr().out


def test_the_s3_model_volume_places_and_fetches_by_name(tmp_path):
    """The volume EKS's pods mount, through real boto3 calls against moto's S3."""
    import boto3
    from moto import mock_aws

    from infra.rollout.tracks import S3Volume

    with mock_aws():
        s3 = boto3.client("s3", region_name="eu-central-1")
        s3.create_bucket(
            Bucket="models", CreateBucketConfiguration={"LocationConstraint": "eu-central-1"}
        )
        volume = S3Volume("models", "resnet50/v3/", tmp_path / "cache", "eu-central-1", s3=s3)
        model = tmp_path / "abc.pt"
        model.write_bytes(b"weights")
        model.with_suffix(".json").write_text(json.dumps({"version": "v9"}))
        assert volume.put(model) == "abc.pt"
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="models")["Contents"]}
        assert keys == {"resnet50/v3/abc.pt", "resnet50/v3/abc.json"}
        fetched = volume.fetch("abc.pt")
        assert fetched.read_bytes() == b"weights" and runtime_version(fetched) == "v9"
        from infra.rollout.tracks import VolumeError

        with pytest.raises(VolumeError, match="s3://models/resnet50/v3/missing.pt"):
            volume.fetch("missing.pt")
