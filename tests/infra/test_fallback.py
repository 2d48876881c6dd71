"""The on-demand fallback of an AWS spot group (infra.aws.fallback) under the mock engine: a second,
on-demand-only group of the same nodes, 0 at rest, that two alarms on the spot group's unfilled
capacity fill and empty. The alarms' metric math is evaluated here on concrete group sizes, and
each step policy is applied to it, so a wrong sign, a missing term or an off-by-one step fails."""

from __future__ import annotations

import base64
import json
import re

import pytest

from infra.offline import run_offline

ASG = "aws:autoscaling/group:Group"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
POLICY = "aws:autoscaling/policy:Policy"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
SPOT, OD = "torchfleet-aws-prod-asg", "torchfleet-aws-prod-od-asg"


@pytest.fixture(scope="module")
def prod(runs):
    return runs["aws-prod"]


def _groups(run) -> dict[str, dict]:
    return {g.inputs["name"]: g.inputs for g in run.of_type(ASG)}


def test_the_fallback_group_is_on_demand_only_and_serves_behind_the_same_target(prod):
    groups = _groups(prod)
    assert set(groups) == {SPOT, OD}
    spot, od = groups[SPOT], groups[OD]
    dist = od["mixedInstancesPolicy"]["instancesDistribution"]
    assert dist["onDemandPercentageAboveBaseCapacity"] == 100
    assert dist["onDemandBaseCapacity"] == od["maxSize"] == spot["maxSize"]
    assert "spotMaxPrice" not in dist
    # 0 at rest; its alarms move the desired size, the spot group's stays the stack's own
    assert (od["minSize"], od["desiredCapacity"]) == (0, 0)
    assert spot["mixedInstancesPolicy"]["instancesDistribution"]["spotMaxPrice"]
    assert od["targetGroupArns"] == spot["targetGroupArns"]
    assert od["healthCheckType"] == "ELB"
    # the same instance types, from a template without spot options whose nodes report to OD
    types = lambda g: [  # noqa: E731
        o["instanceType"] for o in g["mixedInstancesPolicy"]["launchTemplate"]["overrides"]
    ]
    assert types(od) == types(spot)
    templates = {f"{t.name}-id": t.inputs for t in prod.of_type(LT)}
    od_lt = templates[
        od["mixedInstancesPolicy"]["launchTemplate"]["launchTemplateSpecification"][
            "launchTemplateId"
        ]
    ]
    assert "instanceMarketOptions" not in od_lt
    assert od_lt["metadataOptions"]["httpTokens"] == "required"
    user_data = base64.b64decode(od_lt["userData"]).decode()
    assert OD in user_data and SPOT not in user_data.replace(OD, "")
    # its nodes may complete their own group's lifecycle hooks
    grants = [
        json.loads(p.inputs["policy"])
        for p in prod.of_type("aws:iam/rolePolicy:RolePolicy")
        if "autoscaling:CompleteLifecycleAction" in p.inputs["policy"]
    ]
    (grant,) = grants
    resources = grant["Statement"][0]["Resource"]
    assert [r.rsplit("/", 1)[1] for r in resources] == [SPOT, OD]
    # its size metrics feed the alarms; the inventory and readiness know which group it is
    for g in (spot, od):
        assert set(g["enabledMetrics"]) >= {
            "GroupDesiredCapacity",
            "GroupInServiceInstances",
            "GroupPendingInstances",
        }
    assert prod.outputs["discovery"]["fallback_group_name"] == OD


def _evaluate(expression: str, sizes: dict[str, float]) -> float:
    """CloudWatch metric math of the form the alarms use: FILL(id, 0) terms with + and -."""
    python = re.sub(r"FILL\((\w+), 0\)", lambda m: repr(sizes.get(m.group(1), 0)), expression)
    assert re.fullmatch(r"[-+() 0-9.]+", python), python
    return float(eval(python))  # digits, signs and brackets only (checked above)


def _alarm(run, action: str):
    (alarm,) = [a for a in run.of_type(ALARM) if a.inputs["name"].endswith(f"-od-{action}")]
    (policy,) = [p for p in run.of_type(POLICY) if p.inputs["name"].endswith(f"-od-{action}")]
    return alarm.inputs, policy


def _sizes(alarm: dict, groups: dict[str, tuple[int, int, int]]) -> dict[str, float]:
    """Each metric query id -> its value, from (desired, in service, pending) per group."""
    column = {"GroupDesiredCapacity": 0, "GroupInServiceInstances": 1, "GroupPendingInstances": 2}
    out = {}
    for q in alarm["metricQueries"]:
        if "metric" in q:
            m = q["metric"]
            assert m["namespace"] == "AWS/AutoScaling" and m["period"] == 60
            out[q["id"]] = groups[m["dimensions"]["AutoScalingGroupName"]][column[m["metricName"]]]
    return out


def _adjustment(alarm: dict, policy, value: float) -> int:
    """What the step policy does when the alarm's metric is `value` (0: the alarm stays OK)."""
    assert alarm["comparisonOperator"] == "GreaterThanOrEqualToThreshold"
    if value < alarm["threshold"]:
        return 0
    over = value - alarm["threshold"]
    for step in policy.inputs["stepAdjustments"]:
        lo = float(step["metricIntervalLowerBound"])
        hi = float(step.get("metricIntervalUpperBound") or "inf")
        if lo <= over < hi:
            return step["scalingAdjustment"]
    raise AssertionError(f"no step covers {value}")


@pytest.mark.parametrize(
    ("spot", "od", "fill", "back"),
    [
        ((3, 3, 0), (0, 0, 0), 0, 0),  # spot whole: nothing to do
        ((3, 1, 0), (0, 0, 0), 2, 0),  # 2 spot nodes not placed: 2 on-demand
        ((3, 0, 1), (0, 0, 0), 2, 0),  # a pending (bootstrapping) node is no shortfall
        ((3, 1, 0), (2, 0, 2), 0, 0),  # the fill is bootstrapping: no second fill
        ((8, 0, 0), (0, 0, 0), 8, 0),  # nothing at all: up to nodes.max
        ((3, 3, 0), (2, 2, 0), 0, -2),  # spot came back: the 2 on-demand nodes leave
        ((3, 2, 0), (2, 2, 0), 0, -1),  # one came back: one leaves
    ],
)
def test_the_alarms_fill_what_spot_lacks_and_give_it_back(prod, spot, od, fill, back):
    fill_alarm, fill_policy = _alarm(prod, "fill")
    back_alarm, back_policy = _alarm(prod, "return")
    for alarm, policy, want in ((fill_alarm, fill_policy, fill), (back_alarm, back_policy, back)):
        (expr,) = [q for q in alarm["metricQueries"] if q.get("returnData")]
        value = _evaluate(expr["expression"], _sizes(alarm, {SPOT: spot, OD: od}))
        assert _adjustment(alarm, policy, value) == want, (alarm["name"], value)
        assert policy.inputs["policyType"] == "StepScaling"
        assert policy.inputs["adjustmentType"] == "ChangeInCapacity"
        assert policy.inputs["autoscalingGroupName"] == OD
        assert alarm["alarmActions"] == [f"arn:aws:autoscaling:::{policy.name}-id"]
    # filling waits less than giving back: spot returning for a moment is not trusted
    assert fill_alarm["evaluationPeriods"] < back_alarm["evaluationPeriods"]


def test_working_hours_size_the_fallback_to_zero_outside_them(with_overrides):
    # (prod refuses a TTL; the TTL's schedule is the same function's, tested on the spot group)
    run = run_offline(
        "aws-prod",
        with_overrides("aws-prod", schedule={"start": "08:00", "stop": "19:00", "timezone": "UTC"}),
    )
    schedules = [
        s.inputs
        for s in run.of_type("aws:autoscaling/schedule:Schedule")
        if s.inputs["autoscalingGroupName"] == OD
    ]
    by_action = {s["scheduledActionName"]: s for s in schedules}
    assert set(by_action) == {"work-start", "work-stop"}
    assert by_action["work-start"]["desiredCapacity"] == 0  # the alarms size it
    assert by_action["work-start"]["maxSize"] == 8
    assert by_action["work-stop"]["maxSize"] == by_action["work-stop"]["desiredCapacity"] == 0


@pytest.mark.parametrize(
    "spot",
    [
        {"enabled": True, "fallback": "fail"},
        {"enabled": False},
    ],
)
def test_no_fallback_group_without_spot_or_with_fallback_fail(with_overrides, spot):
    run = run_offline("aws-prod", with_overrides("aws-prod", spot=spot))
    assert set(_groups(run)) == {SPOT}
    assert not [a for a in run.of_type(ALARM) if "-od-" in a.inputs["name"]]
    assert "fallback_group_name" not in run.outputs["discovery"]


# -- instances mode: what the program builds once `up` falls back (infra.deploy.capacity) -----

REASON = "InsufficientInstanceCapacity for spot the type in the zones"


def _market(run) -> list[str]:
    """Per GPU node (or its template): spot or on-demand, as the cloud is asked."""
    out = [
        "spot" if lt.inputs.get("instanceMarketOptions") else "on-demand" for lt in run.of_type(LT)
    ]
    out += [
        "on-demand" if i.inputs.get("spotStrategy") == "NoSpot" else "spot"
        for i in run.tagged("alicloud:ecs/instance:Instance", "gpu-node")
    ]
    return out


def _spot_hosts(run) -> list[bool]:
    hosts = run.outputs["inventory"]["all"]["children"]["gpu_nodes"]["hosts"]
    return [h["torchfleet_spot"] for h in hosts.values()]


@pytest.mark.parametrize("stack", ["aws-dev", "alicloud-dev"])
def test_the_fallback_run_buys_the_same_nodes_on_demand(runs, monkeypatch, with_overrides, stack):
    from infra.deploy.capacity import MARKET_ENV

    spot_run = runs[stack]
    assert set(_market(spot_run)) == {"spot"} and all(_spot_hosts(spot_run))
    monkeypatch.setenv(MARKET_ENV, REASON)
    run = run_offline(stack, with_overrides(stack))
    assert set(_market(run)) == {"on-demand"} and len(_market(run)) == len(_market(spot_run))
    assert not any(_spot_hosts(run))  # the runtime's spot watcher stays off
    cost, spot_cost = run.outputs["cost"], spot_run.outputs["cost"]
    assert (cost["spot_nodes"], cost["on_demand_nodes"]) == (0, spot_cost["spot_nodes"])
    assert cost["monthly_worst_case"] > spot_cost["monthly_worst_case"]
    # spot.fallback: fail never buys on-demand, whatever the environment says
    spot = {**with_overrides(stack)["torchfleet:spot"], "fallback": "fail"}
    run = run_offline(stack, with_overrides(stack, spot=spot))
    assert set(_market(run)) == {"spot"}
