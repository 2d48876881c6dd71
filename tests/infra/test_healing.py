"""Every instance the stack runs by itself gets the strongest self-healing its cloud, type and
purchase option allow (infra/healing.py), registered as the plan says: AWS recover and reboot
alarms on the instance's status checks, Alibaba's AutoRecover maintenance action; a group's
nodes are replaced by their group."""

from __future__ import annotations

import pytest

from infra import healing
from infra.catalog import lookup
from infra.offline import run_offline
from infra.plan import STACKS

AWS_INSTANCE, ALI_INSTANCE = "aws:ec2/instance:Instance", "alicloud:ecs/instance:Instance"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"


def alarm_actions(run) -> dict[str, dict[str, dict]]:
    """instance resource id -> EC2 action -> its alarm's inputs."""
    out: dict[str, dict[str, dict]] = {}
    for alarm in run.of_type(ALARM):
        if "InstanceId" not in alarm.inputs.get("dimensions", {}):
            continue  # a group's alarm (the on-demand fallback's: test_fallback.py)
        target = alarm.inputs["dimensions"]["InstanceId"]
        (arn,) = alarm.inputs["alarmActions"]
        out.setdefault(target, {})[arn.rsplit(":", 1)[1]] = alarm.inputs
    return out


def expected(run, inst, cfg_spot: bool, gpu_type: str) -> tuple[str, ...]:
    monitoring = inst.inputs["tags"].get("torchfleet-role") == "monitoring"
    cloud = run.stack.split("-")[0]
    itype = lookup(cloud, gpu_type)
    if monitoring:
        from infra.catalog import HOST_TYPES

        itype = HOST_TYPES[cloud][inst.inputs["instanceType"]]
    return healing.for_instance(cloud, itype, cfg_spot and not monitoring).actions


def check_every_instance(run, spot: bool, gpu_type: str) -> int:
    """Asserts each registered instance's healing; returns how many were checked."""
    checked = 0
    if run.stack.startswith("aws"):
        alarms = alarm_actions(run)
        for inst in run.of_type(AWS_INSTANCE):
            want = expected(run, inst, spot, gpu_type)
            got = alarms.get(f"{inst.name}-id", {})
            assert set(got) == set(want), (inst.name, got)
            for action, a in got.items():
                metric = (
                    "StatusCheckFailed_System"
                    if action == "recover"
                    else "StatusCheckFailed_Instance"
                )
                assert a["metricName"] == metric and a["namespace"] == "AWS/EC2"
                assert a["comparisonOperator"] == "GreaterThanOrEqualToThreshold"
                assert a["alarmActions"] == [f"arn:aws:automate:{run_region(run)}:ec2:{action}"]
            checked += 1
        # no alarm acts on anything but the stack's own instances
        assert set(alarms) <= {f"{i.name}-id" for i in run.of_type(AWS_INSTANCE)}
    else:
        for inst in run.of_type(ALI_INSTANCE):
            assert inst.inputs["maintenanceAction"] == "AutoRecover", inst.name
            checked += 1
    return checked


def run_region(run) -> str:
    (provider,) = [r for r in run.resources if r.type.startswith("pulumi:providers:")]
    return provider.inputs["region"]


@pytest.mark.parametrize("stack", STACKS)
def test_every_instance_of_the_examples_heals_itself(runs, settings, stack):
    run, values = runs[stack], settings(stack)
    gpu = run.outputs["cost"]["instance_type"]
    instances = run.of_type(AWS_INSTANCE) + run.of_type(ALI_INSTANCE)
    assert check_every_instance(run, values["spot"]["enabled"], gpu) == len(instances) > 0


def test_on_demand_ebs_only_types_get_recover_and_instance_store_types_only_reboot(
    with_overrides,
):
    # p3 has no instance store: on-demand, it gets recover and reboot
    p3 = run_offline(
        "aws-dev",
        with_overrides("aws-dev", gpu=None, instance_type="p3.2xlarge", spot={"enabled": False}),
    )
    (node,) = p3.of_type(AWS_INSTANCE)
    assert set(alarm_actions(p3)[f"{node.name}-id"]) == {"recover", "reboot"}
    assert check_every_instance(p3, False, "p3.2xlarge") == 1
    # g6 carries NVMe instance store: reboot only, even on-demand
    g6 = run_offline("aws-dev", with_overrides("aws-dev", spot={"enabled": False}))
    (node,) = g6.of_type(AWS_INSTANCE)
    assert set(alarm_actions(g6)[f"{node.name}-id"]) == {"reboot"}
    # and spot: reboot only, whatever the type
    spot_p3 = run_offline(
        "aws-dev",
        with_overrides(
            "aws-dev",
            gpu=None,
            instance_type="p3.2xlarge",
            spot={"enabled": True, "interruption": "stop"},
        ),
    )
    (node,) = spot_p3.of_type(AWS_INSTANCE)
    assert set(alarm_actions(spot_p3)[f"{node.name}-id"]) == {"reboot"}


def test_the_plan_says_what_heals_each_node(capsys):
    from infra import plan

    assert plan.main(["aws-dev", "aws-prod", "alicloud-dev"]) == 0
    out = capsys.readouterr().out
    assert (
        "aws-dev-gpu-0 (g6.xlarge, spot): reboot - reboot after 3 min of failed instance status "
        "checks; no recover action: AWS does not recover spot"
    ) in out
    assert (
        "aws-prod-monitoring (t3.medium): recover + reboot - recover onto healthy hardware" in out
    )
    assert (
        "group nodes: replace: the group replaces a node that fails the ALB's /readyz check" in out
    )
    assert "alicloud-dev-gpu-1 (ecs.gn7i-c8g1.2xlarge, spot): AutoRecover - ECS restarts it" in out
