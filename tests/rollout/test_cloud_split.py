"""The rollout engine driving a cloud stack's split through its `rollout` config block and `up`
(infra/rollout/cloud.py), with a fake stack runner: its `up` runs the real Pulumi program of
aws-prod under the mock engine, so each step's listener weights are the program's own."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto

from infra.matrix import REPO_ROOT
from infra.offline import run_offline
from infra.rollout.cloud import KEY, CloudSplit, weight_of
from infra.rollout.engine import Options, Rollout
from infra.rollout.policy import Figures
from infra.rollout.ref import ModelRef, Store
from infra.rollout.state import RolloutState

LISTENER = "aws:lb/listener:Listener"
CANDIDATE_FILE = hashlib.sha256(b"candidate").hexdigest() + ".pt"  # group mode: by digest


class FakeStack:
    """The Automation API's Stack as the split uses it: the stack file's config, set_config,
    and an `up` that runs the program offline and keeps the listener's forward weights."""

    def __init__(self, stack: str) -> None:
        self.stack = stack
        doc = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())
        self.values: dict[str, object] = doc["config"]
        self.ups: list[dict[str, int]] = []

    def get_all_config(self) -> dict[str, auto.ConfigValue]:
        return {
            k: auto.ConfigValue(v if isinstance(v, str) else json.dumps(v))
            for k, v in self.values.items()
        }

    def set_config(self, key: str, value: auto.ConfigValue, *, path: bool = False) -> None:
        assert not path
        self.values[key] = value.value

    def up(self) -> None:
        run = run_offline(self.stack, dict(self.values))
        (action,) = [
            a
            for li in run.of_type(LISTENER)
            for a in li.inputs["defaultActions"]
            if a["type"] == "forward"
        ]
        self.ups.append(
            {
                # the mock engine's ARNs end with the group's name + "-id" (infra.offline)
                tg["arn"].removesuffix("-id").rsplit("-", 1)[-1]: int(tg["weight"])
                for tg in action["forward"]["targetGroups"]
            }
        )


class FakeTracks:
    def __init__(self, folder: Path) -> None:
        self.files = {t: folder / f"{t}.pt" for t in ("stable", "candidate")}
        for f in self.files.values():
            f.write_bytes(b"stable")
        self.switches: list[tuple[str, str]] = []

    def serving(self, track: str) -> tuple[Path, str]:
        data = self.files[track].read_bytes()
        return self.files[track], "v1" if data == b"stable" else "v2"

    def switch(self, track: str, model: Path) -> str:
        self.files[track].write_bytes(model.read_bytes())
        version = self.serving(track)[1]
        self.switches.append((track, version))
        return version


class Windows:
    def __init__(self, cand_errors: int = 0) -> None:
        self.cand_errors = cand_errors

    def begin(self) -> None:
        pass

    def end(self) -> dict[str, Figures]:
        return {
            "v1": Figures("v1", 900, 0, 0.05),
            "v2": Figures("v2", 100, self.cand_errors, 0.05),
        }


def _ref(tmp_path: Path) -> ModelRef:
    cand = tmp_path / "cand.pt"
    cand.write_bytes(b"candidate")
    return ModelRef(str(cand), hashlib.sha256(b"candidate").hexdigest())


def test_a_canary_on_aws_moves_the_listener_weights_by_config_and_up(tmp_path, canary_engine):
    stack, tracks = FakeStack("aws-prod"), FakeTracks(tmp_path)
    # the block names the candidate group's model (config.py refuses a share without one); the
    # tracks here are fakes, so the file never changes
    stack.values[KEY] = {"candidate_model": CANDIDATE_FILE}
    split = CloudSplit(stack, stack.up, tracks, say=lambda _: None)
    assert canary_engine(split, Windows()).start(_ref(tmp_path)) == "promoted"
    # 0 % already (no `up` before the switch), the canary's 10 %;
    # at 100 % the stable group out while its nodes load the candidate, then no split: every
    # request to the stable group, which now serves the candidate's model
    assert stack.ups == [
        {"tg": 90, "candidate": 10},
        {"tg": 0, "candidate": 100},
        {"tg": 100, "candidate": 0},
    ]
    assert tracks.switches == [("candidate", "v2"), ("stable", "v2")]
    assert json.loads(str(stack.values[KEY])) == {
        "candidate_weight": 0,
        "candidate_model": CANDIDATE_FILE,
    }


def test_a_failing_candidate_on_aws_is_rolled_back_to_no_split(tmp_path, canary_engine):
    stack, tracks = FakeStack("aws-prod"), FakeTracks(tmp_path)
    stack.values[KEY] = {"candidate_weight": 0, "sticky_s": 600, "candidate_model": CANDIDATE_FILE}
    split = CloudSplit(stack, stack.up, tracks, say=lambda _: None)
    assert canary_engine(split, Windows(cand_errors=30)).start(_ref(tmp_path)) == ("rolled_back")
    # 0 % already: no `up` before the switch; the canary's 10 %, then out at once
    assert stack.ups == [{"tg": 90, "candidate": 10}, {"tg": 100, "candidate": 0}]
    assert tracks.switches == [("candidate", "v2"), ("candidate", "v1")]
    assert json.loads(str(stack.values[KEY])) == {
        "candidate_weight": 0,
        "sticky_s": 600,
        "candidate_model": CANDIDATE_FILE,
    }


@pytest.mark.parametrize(
    ("weights", "percent"),
    [
        ({"stable": 180, "candidate": 20}, 10),
        ({"stable": 0, "candidate": 1}, 100),
        ({"stable": 100, "candidate": 100}, 0),
        ({"stable": 100, "candidate": 0}, 0),
        ({"stable": 50, "candidate": 150}, 75),
    ],
)
def test_weight_of_the_engines_weights(weights, percent):
    assert weight_of(weights) == percent


def test_kubernetes_caps_the_split_below_a_promotion(tmp_path):
    ups: list[int] = []

    class Handle:
        values: dict[str, auto.ConfigValue] = {}

        def get_all_config(self):
            return self.values

        def set_config(self, key, value, *, path=False):
            self.values[key] = value
            ups.append(json.loads(value.value)["candidate_weight"])

    split = CloudSplit(Handle(), lambda: None, FakeTracks(tmp_path), cloud_limit=99, say=print)
    split.set_weights({"stable": 0, "candidate": 100})
    split.set_weights({"stable": 0, "candidate": 100})  # unchanged: no second `up`
    assert ups == [99]
    # a shadow test runs on the stable track's pods; the candidate track has none outside a split
    assert split.set_shadow("candidate", tmp_path / "x.pt") is None


def test_a_fifty_percent_step_keeps_the_split_at_half(tmp_path):
    """--steps 10,50,100: the engine's 50 % step gives both tracks equal weights, which while
    they serve two versions is half the requests each, not the end of the split."""
    stack, tracks = FakeStack("aws-prod"), FakeTracks(tmp_path)
    stack.values[KEY] = {"candidate_model": CANDIDATE_FILE}
    split = CloudSplit(stack, stack.up, tracks, say=lambda _: None)
    clock = [0.0]
    engine = Rollout(
        split,
        RolloutState(tmp_path / "rollout.json"),
        Store(tmp_path / "store"),
        Windows(),
        Options(strategy="linear", steps="10,50,100", bake_s=10, window_s=5),
        say=lambda _: None,
        clock=lambda: clock[0],
        sleep=lambda s: clock.__setitem__(0, clock[0] + s),
    )
    assert engine.start(_ref(tmp_path)) == "promoted"
    assert stack.ups == [
        {"tg": 90, "candidate": 10},
        {"tg": 50, "candidate": 50},
        {"tg": 0, "candidate": 100},
        {"tg": 100, "candidate": 0},
    ]


def test_equal_weights_are_half_each_only_while_the_tracks_serve_two_versions(tmp_path):
    stack, tracks = FakeStack("aws-prod"), FakeTracks(tmp_path)
    stack.values[KEY] = {"candidate_model": CANDIDATE_FILE}
    split = CloudSplit(stack, stack.up, tracks, say=lambda _: None)
    split.set_weights({"candidate": 0, "stable": 100})  # no split yet: nothing to apply
    assert split.serving("stable")[1] == split.serving("candidate")[1] == "v1"
    split.set_weights({"candidate": 100, "stable": 100})  # one version on both: no split
    assert stack.ups == []
    cand = tmp_path / "cand.pt"
    cand.write_bytes(b"candidate")
    split.switch("candidate", cand)
    split.set_weights({"candidate": 100, "stable": 100})  # two versions: half each
    split.set_weights({"candidate": 0, "stable": 100})  # out at once
    split.switch("candidate", tracks.files["stable"])
    split.set_weights({"candidate": 100, "stable": 100})  # one version again: no split
    assert stack.ups == [{"tg": 50, "candidate": 50}, {"tg": 100, "candidate": 0}]
