"""A group stack's promotion reaching its running nodes (infra/rollout/refresh.py).

- Alibaba: EssRoll through the official ESS SDK with the operator's keys, against the loopback
  fake that checks every request's ACS3 signature (tests/bootstrap/fake_alibaba.py) answering
  as a scaling group would (tests/rollout/ess_sim.py): old nodes replaced surge first, batch by
  batch, never fewer in service than before, MaxSize raised for the surge and put back; a batch
  that never enters service stops the roll with the old nodes still serving.
- AWS: AsgRefresh over boto3's autoscaling client with botocore's Stubber (moto has no
  instance refreshes): it waits for the refresh `up` started, names the reason of one that
  failed, and does not wait for a refresh older than the change.
No real time passes: the clock and sleep are the test's."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber
from ess_sim import EssSim
from fake_alibaba import FakeAlibaba  # tests/rollout/conftest.py makes it importable

from infra.rollout import refresh
from infra.rollout.refresh import AsgRefresh, EssRoll, RefreshError

GROUP = "torchfleet-alicloud-prod-ess"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _roll(sim: EssSim, fake: FakeAlibaba, monkeypatch, lines: list[str], clock: Clock) -> EssRoll:
    monkeypatch.setenv("ALICLOUD_ESS_ENDPOINT", fake.url)
    return EssRoll(
        GROUP,
        fake.region,
        lines.append,
        clock=clock,
        sleep=clock.sleep,
        batch_timeout_s=600,
    )


@pytest.mark.parametrize(("nodes", "batch"), [(4, 1), (6, 2)])
def test_ess_roll_replaces_every_old_node_surge_first(alibaba_keys, monkeypatch, nodes, batch):
    sim = EssSim(GROUP, nodes)  # at MaxSize: the surge needs MaxSize raised
    before = set(sim.nodes)
    sim.active = "scfg-new"  # what `up` did: a new scaling configuration, active at once
    lines: list[str] = []
    with FakeAlibaba(sim.answer) as fake:
        _roll(sim, fake, monkeypatch, lines, Clock()).roll()
    assert fake.refused == []
    serving = sim.serving()
    assert len(serving) == nodes and set(serving.values()) == {"scfg-new"}
    assert not before & set(sim.nodes)  # every old node released
    assert min(sim.in_service) >= nodes  # never fewer in service than before the roll
    assert [len(r) for r in sim.removed] == [batch] * (nodes // batch)
    # raised by the batch for each surge, then the plan's MaxSize again
    assert sim.max_sizes[-1] == nodes and max(sim.max_sizes) == nodes + batch
    assert (sim.desired, sim.max_size) == (nodes, nodes)
    calls = [c["action"] for c in fake.calls]
    assert calls.count("RemoveInstances") == nodes // batch
    assert all(c["version"] == "2022-02-22" for c in fake.calls)
    assert (
        lines[-1]
        == f"  {GROUP}: {nodes} node(s) in service, all on the active configuration scfg-new"
    )
    assert f"{nodes} node(s) in service on an older configuration; {batch} more on" in lines[0]


def test_ess_roll_with_room_below_max_size_leaves_max_size_alone(alibaba_keys, monkeypatch):
    sim = EssSim(GROUP, 2, max_size=6)
    sim.active = "scfg-new"
    with FakeAlibaba(sim.answer) as fake:
        _roll(sim, fake, monkeypatch, [], Clock()).roll()
    assert set(sim.serving().values()) == {"scfg-new"} and sim.max_sizes == []
    assert "MaxSize" not in str([c["params"] for c in fake.calls])


def test_ess_roll_on_nodes_already_on_the_active_configuration_changes_nothing(
    alibaba_keys, monkeypatch
):
    sim = EssSim(GROUP, 3, configuration="scfg-new")
    with FakeAlibaba(sim.answer) as fake:
        _roll(sim, fake, monkeypatch, [], Clock()).roll()
    assert {c["action"] for c in fake.calls} == {
        "DescribeScalingGroups",
        "DescribeScalingInstances",
    }


def test_a_batch_that_never_serves_stops_the_roll_with_the_old_nodes_serving(
    alibaba_keys, monkeypatch
):
    sim = EssSim(GROUP, 3, max_size=6, ready_after=None)
    old = set(sim.nodes)
    sim.active = "scfg-new"
    clock = Clock()
    with FakeAlibaba(sim.answer) as fake:
        roll = _roll(sim, fake, monkeypatch, [], clock)
        with pytest.raises(
            RefreshError,
            match=r"not 1 new node\(s\) in service on scfg-new after 600 s; the group holds "
            r".*i-0003 Pending \(scfg-new\)",
        ):
            roll.roll()
    assert set(sim.serving()) == old  # nobody removed: the old nodes still serve
    assert sim.removed == [] and clock.now >= 600


def test_ess_roll_names_a_missing_group_and_missing_keys(alibaba_keys, monkeypatch):
    sim = EssSim("another-group", 1)
    with (
        FakeAlibaba(sim.answer) as fake,
        pytest.raises(RefreshError, match=f"no scaling group {GROUP} in cn-shanghai"),
    ):
        _roll(sim, fake, monkeypatch, [], Clock()).roll()
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_ID")
    with pytest.raises(
        RefreshError,
        match="^only one of ALIBABA_CLOUD_ACCESS_KEY_ID and .*: export both",
    ):
        EssRoll(GROUP, "cn-shanghai").roll()
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
    monkeypatch.setenv("HOME", "/nonexistent")
    with pytest.raises(RefreshError, match="no Alibaba Cloud credentials to reach ESS"):
        EssRoll(GROUP, "cn-shanghai").roll()


def test_ess_roll_reports_a_refused_call(alibaba_keys, monkeypatch):
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "not-the-secret")
    sim = EssSim(GROUP, 1)
    with (
        FakeAlibaba(sim.answer) as fake,
        pytest.raises(RefreshError, match="ESS DescribeScalingGroups on .*SignatureDoesNotMatch"),
    ):
        _roll(sim, fake, monkeypatch, [], Clock()).roll()


# --- AWS ------------------------------------------------------------------------------------


def _refresh(status: str, started: datetime, pct: int = 0, reason: str = "") -> dict:
    r = {
        "InstanceRefreshId": "ir-1",
        "AutoScalingGroupName": "torchfleet-aws-prod-asg",
        "Status": status,
        "StartTime": started,
        "PercentageComplete": pct,
        "InstancesToUpdate": 2,
    }
    if reason:
        r["StatusReason"] = reason
    return {"InstanceRefreshes": [r]}


def _asg(replies: list[dict]) -> tuple[object, Stubber]:
    client = boto3.client(
        "autoscaling", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stub = Stubber(client)
    for reply in replies:
        stub.add_response(
            "describe_instance_refreshes",
            reply,
            {
                "AutoScalingGroupName": reply["InstanceRefreshes"][0]["AutoScalingGroupName"]
                if reply["InstanceRefreshes"]
                else "torchfleet-aws-prod-asg",
                "MaxRecords": 1,
            },
        )
    stub.activate()
    return client, stub


SINCE = datetime(2026, 12, 3, 6, 0, tzinfo=UTC)
LATER = datetime(2026, 12, 3, 6, 0, 30, tzinfo=UTC)


def test_asg_refresh_waits_for_the_refresh_up_started():
    client, stub = _asg(
        [
            _refresh("Pending", LATER),
            _refresh("InProgress", LATER, 50),
            _refresh("InProgress", LATER, 50),
            _refresh("Successful", LATER, 100),
        ]
    )
    lines: list[str] = []
    clock = Clock()
    AsgRefresh(
        ["torchfleet-aws-prod-asg"],
        "us-east-1",
        lines.append,
        asg=client,
        clock=clock,
        sleep=clock.sleep,
    ).roll(SINCE.timestamp())
    stub.assert_no_pending_responses()
    assert clock.now == 3 * refresh.POLL_S
    assert len(lines) == 3  # one line per change, not per poll
    assert lines[-1].endswith("instance refresh ir-1 Successful, 100 % done, 2 node(s) to replace")


@pytest.mark.parametrize("status", ["Failed", "RollbackSuccessful", "Cancelled"])
def test_asg_refresh_that_does_not_succeed_raises_with_the_reason(status):
    client, _ = _asg([_refresh(status, LATER, 50, reason="instances failed to become healthy")])
    with pytest.raises(
        RefreshError, match=f"ir-1 of torchfleet-aws-prod-asg ended {status}: instances failed"
    ):
        AsgRefresh(["torchfleet-aws-prod-asg"], "us-east-1", asg=client, say=lambda _: None).roll(
            SINCE.timestamp()
        )


def test_asg_refresh_older_than_the_change_or_none_is_not_waited_for():
    earlier = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
    client, stub = _asg([_refresh("InProgress", earlier), {"InstanceRefreshes": []}])
    lines: list[str] = []
    AsgRefresh(["torchfleet-aws-prod-asg"] * 2, "us-east-1", lines.append, asg=client).roll(
        SINCE.timestamp()
    )
    stub.assert_no_pending_responses()
    assert all("no node to replace" in line for line in lines) and len(lines) == 2


def test_asg_refresh_gives_up_after_its_timeout_naming_what_goes_on():
    client, _ = _asg([_refresh("InProgress", LATER, 40)] * 3)
    clock = Clock()
    roll = AsgRefresh(
        ["torchfleet-aws-prod-asg"],
        "us-east-1",
        asg=client,
        say=lambda _: None,
        clock=clock,
        sleep=clock.sleep,
        timeout_s=2 * refresh.POLL_S,
    )
    with pytest.raises(
        RefreshError, match="still InProgress after 30 s \\(40 % done\\); it goes on in AWS"
    ):
        roll.roll(SINCE.timestamp())
