"""aws-prod as a group-mode rollout sees it (tests/rollout/test_group_rollout.py and
test_targeted_step.py): its model files and their digests, a fake Automation API stack whose `up`
runs the real aws-prod program under the mock engine and records each `up`'s group sizes, models
and candidate weight, the engine's stub windows for the two digests, and the CloudSplit over it.
The bucket is moto's (the fixture s3 in conftest.py)."""

from __future__ import annotations

import base64
import hashlib
import json
from functools import partial
from pathlib import Path

import yaml
from fixed_windows import FixedWindows
from pulumi import automation as auto

from infra import config
from infra.bootstrap.torchfleet_agent import boot
from infra.matrix import REPO_ROOT
from infra.offline import run_offline
from infra.rollout.cloud import KEY, CloudSplit
from infra.rollout.ref import ModelRef
from infra.rollout.tracks import ModelTracks, bundle_model, volume_of

STACK = "aws-prod"
BUCKET, REGION = "example-torchfleet-models", "us-east-1"  # Pulumi.aws-prod.yaml's
STABLE_BYTES, CAND_BYTES = b"stable model", b"candidate model"
STABLE_SHA = hashlib.sha256(STABLE_BYTES).hexdigest()
CAND_SHA = hashlib.sha256(CAND_BYTES).hexdigest()
CANDIDATE_GROUP = "torchfleet-aws-prod-candidate-asg"
# A canary rolled back at 10 % on a stack whose stable groups serve STABLE_SHA, one state per
# `up`: the candidate named (no group at weight 0), the canary's node, out at once (weight 0:
# its group removed), then the candidate track named on the stable's file; the stable groups
# never moved
ROLLED_BACK = [
    (0, None, STABLE_SHA, 0),
    (1, CAND_SHA, STABLE_SHA, 10),
    (0, None, STABLE_SHA, 0),
    (0, None, STABLE_SHA, 0),
]


def _node_model(run, group: dict) -> str | None:
    """The digest of the model a group's node config names (None: the bundle's)."""
    templates = {
        f"{t.name}-id": t.inputs for t in run.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    }
    spec = group["mixedInstancesPolicy"]["launchTemplate"]["launchTemplateSpecification"]
    doc = yaml.safe_load(base64.b64decode(templates[spec["launchTemplateId"]]["userData"]))
    (entry,) = [f for f in doc["write_files"] if f["path"] == boot.CONFIG]
    model = json.loads(entry["content"]).get("model")
    if model is None:
        return None
    digest = model["checksum"].removeprefix("sha256:")
    assert model["source"] == f"s3://{BUCKET}/models/{digest}.pt"
    return digest


class FakeStack:
    """The Automation API's Stack as the split uses it; `up` runs aws-prod offline and records
    (candidate nodes, candidate model, stable model, the listener's candidate weight)."""

    def __init__(self, block: dict | None = None) -> None:
        doc = yaml.safe_load((REPO_ROOT / f"Pulumi.{STACK}.yaml").read_text())
        self.values: dict[str, object] = doc["config"]
        if block is not None:
            self.values[KEY] = block
        self.ups: list[tuple[int, str | None, str | None, int]] = []
        self.outputs_of_up: dict[str, object] = {}

    def get_all_config(self) -> dict[str, auto.ConfigValue]:
        return {
            k: auto.ConfigValue(v if isinstance(v, str) else json.dumps(v))
            for k, v in self.values.items()
        }

    def outputs(self) -> dict[str, auto.OutputValue]:
        return {k: auto.OutputValue(v, False) for k, v in self.outputs_of_up.items()}

    def set_config(self, key: str, value: auto.ConfigValue, *, path: bool = False) -> None:
        assert not path
        self.values[key] = json.loads(value.value)

    def up(self) -> None:
        run = run_offline(STACK, dict(self.values))
        self.outputs_of_up = dict(run.outputs)
        groups = {g.inputs["name"]: g.inputs for g in run.of_type("aws:autoscaling/group:Group")}
        cand = groups.get(CANDIDATE_GROUP)
        stable_models = {_node_model(run, g) for n, g in groups.items() if n != CANDIDATE_GROUP}
        assert len(stable_models) == 1  # the spot group and its on-demand fallback agree
        (forward,) = [
            a
            for li in run.of_type("aws:lb/listener:Listener")
            for a in li.inputs["defaultActions"]
            if a["type"] == "forward"
        ]
        weights = {
            tg["arn"].endswith("candidate-id"): int(tg["weight"])
            for tg in forward["forward"]["targetGroups"]
        }
        if cand is not None:  # a candidate group is registered in the candidate target group
            assert [a.endswith("tg-candidate-id") for a in cand["targetGroupArns"]] == [True]
        self.ups.append(
            (
                int(cand["desiredCapacity"]) if cand else 0,
                _node_model(run, cand) if cand else None,
                stable_models.pop(),
                weights[True],
            )
        )


# no sidecars: each file's model_version is its digest
Windows = partial(FixedWindows, "sha256:" + STABLE_SHA[:12], "sha256:" + CAND_SHA[:12])


def stack_config(stack: FakeStack) -> config.StackConfig:
    raw = {k.split(":", 1)[1]: v for k, v in stack.values.items()}
    return config.load(raw, STACK)


def candidate_ref(tmp_path: Path) -> ModelRef:
    cand = tmp_path / "cand.pt"
    cand.write_bytes(CAND_BYTES)
    return ModelRef(str(cand), CAND_SHA)


def cloud_split(
    tmp_path: Path, stack: FakeStack, s3: object, stable_default=None, refresh=None
) -> CloudSplit:
    volume = volume_of(stack_config(stack), tmp_path / "volume")
    tracks = ModelTracks(
        stack,
        stack.up,
        volume,
        say=lambda _: None,
        stable_default=stable_default or bundle_model(STACK, tmp_path / "bundle", REGION),
        refresh=refresh,
    )
    return CloudSplit(stack, stack.up, tracks, cloud_limit=100, say=lambda _: None)
