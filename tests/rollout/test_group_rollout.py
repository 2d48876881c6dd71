"""`torchfleet rollout` on an AWS group stack: the engine drives aws-prod's stable and candidate
Auto Scaling groups through CloudSplit (the split: `candidate_weight` and `up`) and ModelTracks
(which file each group's nodes serve: `candidate_model` / `stable_model`, placed by digest in
the stack's model_bucket under models/, here moto's S3). The fake stack's `up` runs the real
aws-prod program under the mock engine and keeps, per `up`, the candidate group's size, the
model in each group's node config and the listener's candidate weight, so what is asserted is
the program's own. Also the command itself on aws-prod (its wiring, with --prometheus, and
without it the figures from CloudWatch: moto's, the dimensions the program's outputs)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_prod_stack import (
    BUCKET,
    CAND_BYTES,
    CAND_SHA,
    REGION,
    ROLLED_BACK,
    STABLE_BYTES,
    STABLE_SHA,
    STACK,
    FakeStack,
    Windows,
    candidate_ref,
    cloud_split,
    stack_config,
)

from infra import bundle
from infra.rollout import clouds, command, signals
from infra.rollout.cloud import KEY
from infra.rollout.engine import Rollout
from infra.rollout.refresh import RefreshError
from infra.rollout.state import RolloutState
from infra.rollout.tracks import VolumeError


class Refreshes:
    """The promotion's wait on the stable groups' instance refresh (refresh.AsgRefresh, tested
    in test_refresh.py): when it ran (how many `up`s before it) and whether it fails."""

    def __init__(self, stack: FakeStack, fail: int = 0) -> None:
        self.stack, self.fail = stack, fail
        self.at: list[int] = []

    def roll(self, since: float) -> None:
        self.at.append(len(self.stack.ups))
        if len(self.at) <= self.fail:
            raise RefreshError("the instance refresh ir-1 of torchfleet-aws-prod-asg ended Failed")


def test_a_canary_on_aws_prod_grows_a_candidate_group_then_rolls_the_stable_group(
    tmp_path, s3, monkeypatch, canary_engine
):
    """The stable nodes serve the bundle's model (the group vars name it in model_bucket)."""
    s3.put_object(Bucket=BUCKET, Key="models/model.pt", Body=STABLE_BYTES)
    monkeypatch.setattr(
        bundle,
        "stack_model",
        lambda stack: {
            "model_source": f"s3://{BUCKET}/models/model.pt",
            "model_checksum": f"sha256:{STABLE_SHA}",
        },
    )
    stack = FakeStack()  # no rollout block yet: the first `up` adds it at weight 0
    refreshes = Refreshes(stack)
    split = cloud_split(tmp_path, stack, s3, refresh=refreshes)
    assert canary_engine(split, Windows()).start(candidate_ref(tmp_path)) == "promoted"
    # the stable groups' refresh awaited once, right after the `up` that moved their model and
    # before the candidate group leaves
    assert refreshes.at == [5]
    # the checked copy in the bucket by its digest, what the nodes download and verify
    body = s3.get_object(Bucket=BUCKET, Key=f"models/{CAND_SHA}.pt")["Body"].read()
    assert body == CAND_BYTES
    # aws-prod: nodes min 2, max 8. The block written (the candidate target group, weight 0),
    # the candidate file named (no candidate group at 0 %), the
    # canary's 10 % (one candidate node), at 100 % the candidate group as large as nodes.max
    # leaves beside the stable minimum (6) with every request while the stable groups roll to
    # the candidate's model (instance refresh), then no split: the candidate group gone, the
    # stable groups on the candidate's model
    assert stack.ups == [
        (0, None, None, 0),
        (0, None, None, 0),
        (1, CAND_SHA, None, 10),
        (6, CAND_SHA, None, 100),
        (6, CAND_SHA, CAND_SHA, 100),
        (0, None, CAND_SHA, 0),
    ]
    assert stack.values[KEY] == {
        "candidate_weight": 0,
        "candidate_model": f"{CAND_SHA}.pt",
        "stable_model": f"{CAND_SHA}.pt",
    }
    doc = RolloutState(tmp_path / "rollout.json").read()
    assert doc["status"] == "promoted" and doc["stable"]["version"] == Windows().candidate
    assert doc["previous"]["version"] == Windows().stable


def test_a_failing_candidate_on_aws_prod_is_rolled_back_and_its_group_removed(
    tmp_path, s3, canary_engine
):
    """A stack whose stable group already serves a placed file (stable_model)."""
    s3.put_object(Bucket=BUCKET, Key=f"models/{STABLE_SHA}.pt", Body=STABLE_BYTES)
    stack = FakeStack({"candidate_weight": 0, "stable_model": f"{STABLE_SHA}.pt"})
    split = cloud_split(tmp_path, stack, s3)
    result = canary_engine(split, Windows(cand_errors=30)).start(candidate_ref(tmp_path))
    assert result == "rolled_back"
    assert stack.ups == ROLLED_BACK
    assert stack.values[KEY]["candidate_weight"] == 0
    assert stack.values[KEY]["candidate_model"] == f"{STABLE_SHA}.pt"
    assert RolloutState(tmp_path / "rollout.json").read()["status"] == "rolled_back"


def test_a_promotion_whose_refresh_fails_puts_the_stable_groups_back_and_rolls_back(
    tmp_path, s3, canary_engine
):
    s3.put_object(Bucket=BUCKET, Key=f"models/{STABLE_SHA}.pt", Body=STABLE_BYTES)
    stack = FakeStack({"candidate_weight": 0, "stable_model": f"{STABLE_SHA}.pt"})
    refreshes = Refreshes(stack, fail=1)
    split = cloud_split(tmp_path, stack, s3, refresh=refreshes)
    assert canary_engine(split, Windows()).start(candidate_ref(tmp_path)) == "rolled_back"
    # at 100 % the stable groups moved to the candidate's model, their refresh failed: the
    # stable model named again and its nodes rolled back onto it (the second wait), then the
    # engine's rollback (the candidate group out, then gone)
    assert stack.ups[-5:] == [
        (6, CAND_SHA, STABLE_SHA, 100),
        (6, CAND_SHA, CAND_SHA, 100),
        (6, CAND_SHA, STABLE_SHA, 100),
        (0, None, STABLE_SHA, 0),
        (0, None, STABLE_SHA, 0),
    ]
    assert refreshes.at == [len(stack.ups) - 3, len(stack.ups) - 2]
    assert stack.values[KEY]["stable_model"] == f"{STABLE_SHA}.pt"
    doc = RolloutState(tmp_path / "rollout.json").read()
    assert doc["status"] == "rolled_back" and doc["stable"]["version"] == Windows().stable
    assert "ended Failed" in doc["timeline"][-1]["reason"]


def test_the_stable_file_must_be_readable_or_named(tmp_path, s3, canary_engine):
    """aws-prod's example group vars name a placeholder bucket: the stable track cannot be read,
    and the message says which key to set; nothing was switched."""
    stack = FakeStack()
    split = cloud_split(tmp_path, stack, s3)
    with pytest.raises(
        VolumeError, match="rollout.stable_model is unset .* 's3://REPLACE-with-your-bucket"
    ):
        canary_engine(split, Windows()).start(candidate_ref(tmp_path))
    assert stack.ups == []


def test_a_model_with_a_sidecar_is_refused_on_a_group_stack(tmp_path, s3, canary_engine):
    s3.put_object(Bucket=BUCKET, Key=f"models/{STABLE_SHA}.pt", Body=STABLE_BYTES)
    stack = FakeStack({"candidate_weight": 0, "stable_model": f"{STABLE_SHA}.pt"})
    split = cloud_split(tmp_path, stack, s3)
    ref = candidate_ref(tmp_path)
    Path(ref.location).with_suffix(".json").write_text(json.dumps({"version": "v2"}))
    assert canary_engine(split, Windows()).start(ref) == "rolled_back"  # guard "load"
    assert all(up[0] == 0 for up in stack.ups)  # no candidate node ever started
    timeline = RolloutState(tmp_path / "rollout.json").read()["timeline"]
    assert "sidecar" in timeline[-1]["reason"]


def test_the_command_drives_aws_prod(tmp_path, s3, monkeypatch, capsys):
    """`torchfleet rollout aws-prod --model ... --prometheus URL` through command.run: the
    group-mode wiring (the S3 volume under models/, the stack's `up`), a canary promoted."""
    s3.put_object(Bucket=BUCKET, Key=f"models/{STABLE_SHA}.pt", Body=STABLE_BYTES)
    stack = FakeStack({"candidate_weight": 0, "stable_model": f"{STABLE_SHA}.pt"})
    monkeypatch.setattr(command, "FLEETS", tmp_path / "fleets")
    monkeypatch.setattr(command.automation, "open_stack", lambda name: stack)
    monkeypatch.setattr(command.preflight, "check_config", lambda name: (None, stack_config(stack)))
    monkeypatch.setattr(command, "PrometheusSource", lambda url, selector: Windows())
    waited: list[tuple[list[str], str]] = []
    monkeypatch.setattr(
        clouds,
        "AsgRefresh",
        lambda groups, region, say: type(
            "Wait", (), {"roll": lambda self, since: waited.append((groups, region))}
        )(),
    )
    ref = candidate_ref(tmp_path)
    args = argparse.Namespace(
        words=[STACK],
        model=str(ref),
        strategy="canary",
        steps=None,
        bake="0.01s",
        window="0.01s",
        guard=[],
        prometheus="http://127.0.0.1:9090",
        selector="",
        fleet=None,
    )
    # every config change through the fake stack's whole `up` (the targeted weight step is
    # tests/rollout/test_targeted_step.py's)
    whole = {"up_of": lambda name: stack.up, "step_of": lambda *_: lambda before: stack.up()}
    assert command.run(args, print, **whole) == 0, capsys.readouterr().out
    assert stack.ups[-1] == (0, None, CAND_SHA, 0)
    # the promotion waited on both stable groups: the spot group and its on-demand fallback
    assert waited == [(["torchfleet-aws-prod-asg", "torchfleet-aws-prod-od-asg"], REGION)]
    doc = RolloutState(tmp_path / "fleets" / STACK / "rollout.json").read()
    assert doc["status"] == "promoted"


class NoPercentiles:
    """moto's CloudWatch cannot compute a "p99" (tests/rollout/test_cloudwatch_source.py): those
    queries get no data point here, the counts are moto's."""

    def __init__(self, cw: Any) -> None:
        self.cw = cw

    def get_metric_data(self, MetricDataQueries: list[dict], **kw: Any) -> dict:
        counted = [q for q in MetricDataQueries if q["MetricStat"]["Stat"] != "p99"]
        doc = dict(self.cw.get_metric_data(MetricDataQueries=counted, **kw))
        doc["MetricDataResults"] += [
            {"Id": q["Id"], "Values": [], "StatusCode": "Complete"}
            for q in MetricDataQueries
            if q not in counted
        ]
        return doc


def test_without_prometheus_the_command_judges_aws_prod_by_cloudwatch(
    tmp_path, s3, monkeypatch, capsys
):
    """No --prometheus: CloudWatchSource over the ALB's target groups named by the stack's
    outputs (as `up` left them); the candidate's target group answers 30 % 5xx in the window,
    so the canary's first window rolls it back (exit 10). The engine's clock and sleep are fake:
    the "traffic" is put into moto's CloudWatch while the window sleeps."""
    s3.put_object(Bucket=BUCKET, Key=f"models/{STABLE_SHA}.pt", Body=STABLE_BYTES)
    stack = FakeStack({"candidate_weight": 0, "stable_model": f"{STABLE_SHA}.pt"})
    minute = datetime(2026, 12, 3, 3, 0, tzinfo=UTC)
    now = (minute + timedelta(seconds=125)).timestamp()  # reads [minute, minute + 60 s)
    cw = boto3.client("cloudwatch", region_name=REGION)

    def traffic() -> None:
        dims = stack.outputs_of_up["rollout_metrics"]
        for track, requests, errors in (("stable", 900, 0), ("candidate", 100, 30)):
            tg = [
                {"Name": "LoadBalancer", "Value": dims["load_balancer"]},
                {"Name": "TargetGroup", "Value": dims["target_groups"][track]},
            ]
            at = minute + timedelta(seconds=20)
            cw.put_metric_data(
                Namespace=dims["namespace"],
                MetricData=[
                    {
                        "MetricName": "RequestCount",
                        "Dimensions": tg,
                        "Timestamp": at,
                        "Value": requests,
                    },
                    {
                        "MetricName": "HTTPCode_Target_5XX_Count",
                        "Dimensions": tg,
                        "Timestamp": at,
                        "Value": errors,
                    },
                ],
            )

    clock = [0.0]

    def sleep(s: float) -> None:
        if clock[0] == 0.0:
            traffic()
        clock[0] += s

    monkeypatch.setattr(command, "FLEETS", tmp_path / "fleets")
    monkeypatch.setattr(command.automation, "open_stack", lambda name: stack)
    monkeypatch.setattr(command.preflight, "check_config", lambda name: (None, stack_config(stack)))
    monkeypatch.setattr(command, "Rollout", partial(Rollout, clock=lambda: clock[0], sleep=sleep))

    class AtNow(signals.CloudWatchSource):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, client=NoPercentiles(cw), clock=lambda: now, **kw)

    monkeypatch.setitem(
        clouds.CLOUDS, "aws", dataclasses.replace(clouds.CLOUDS["aws"], figures=AtNow)
    )
    args = argparse.Namespace(
        words=[STACK],
        model=str(candidate_ref(tmp_path)),
        strategy="canary",
        steps=None,
        bake="60s",
        window=None,  # CloudWatch's default: 60s
        guard=[],
        prometheus=None,
        selector="",
        fleet=None,
    )
    lines: list[str] = []
    whole = {"up_of": lambda name: stack.up, "step_of": lambda *_: lambda before: stack.up()}
    assert command.run(args, lines.append, **whole) == 10, lines
    assert lines[0].startswith(
        f"rollout {STACK}: figures from CloudWatch (AWS/ApplicationELB per target group, "
        f"{REGION}): each window reads a 60 s metric period"
    ), lines
    judged = [line for line in lines if "step 1 10 %" in line]
    assert "100 req, 30.00 % 5xx" in judged[0] and "900 req, 0.00 % 5xx" in judged[0], lines
    assert "error_ratio" in judged[0]
    doc = RolloutState(tmp_path / "fleets" / STACK / "rollout.json").read()
    assert doc["status"] == "rolled_back"
    assert stack.values[KEY]["candidate_weight"] == 0
