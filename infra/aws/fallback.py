"""On-demand fallback of an AWS group that runs on spot (`spot.fallback: on_demand`, the default).

Why a mechanism of our own: an Auto Scaling group with a mixed instances policy keeps its spot
share on spot; when no pool of its types has spot capacity at the cap, it retries spot and the
group stays short of its desired count. AWS has no "fall back to on-demand" switch (Alibaba's
ESS has one, `compensate_with_on_demand`, which the Alibaba group sets).

The mechanism: a second group of the same nodes, on-demand only (`<stack>-od-asg`: the same
launch template but for the group its nodes report their lifecycle to, the same target group,
health check, lifecycle hooks and instance refresh), 0 nodes at rest, driven by the spot group's
unfilled capacity:

    shortfall = spot group desired - (its InService + Pending) - (fallback InService + Pending)

from the groups' own 1-minute metrics (free: GroupDesiredCapacity, GroupInServiceInstances,
GroupPendingInstances; a node still in its launch hook is Pending, so a bootstrapping node is
not a shortfall). Two CloudWatch alarms on that expression drive two step scaling policies of
the fallback group:
- fill: shortfall >= 1 for FILL_MINUTES in a row adds exactly the shortfall in on-demand nodes
  (one step per size up to nodes.max);
- return: shortfall <= -1 (a surplus: the spot group got its capacity back) for RETURN_MINUTES
  in a row removes exactly the surplus from the fallback group, through its terminate hook
  (drained first). The fallback group never holds more than the spot group lacks, and goes
  back to 0 once spot is whole again.
Working hours and the TTL resize it like the spot group (infra.aws.teardown): 0..max while
working, 0 outside and after the TTL.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.aws import scaling
from infra.aws.scaling import GROUP_METRICS
from infra.config import StackConfig
from infra.lifecycle import INSTANCE_WARMUP_S
from infra.nodeboot import fallback_group_name, group_name

FILL_MINUTES = 5  # spot may take a minute or two to be placed; past this it is not coming
RETURN_MINUTES = 15  # the spot group whole for this long: its capacity is back
CAPACITY_TAG = ("torchfleet-capacity", "on-demand-fallback")


def enabled(cfg: StackConfig) -> bool:
    return (
        cfg.cloud == "aws"
        and cfg.mode == "group"
        and cfg.spot.enabled
        and cfg.spot.fallback == "on_demand"
    )


def stable_groups(cfg: StackConfig) -> list[str]:
    """The stable track's Auto Scaling groups: the spot group and, when enabled, its on-demand
    fallback (a rollout's promotion waits for both to refresh)."""
    return [group_name(cfg)] + ([fallback_group_name(cfg)] if enabled(cfg) else [])


def shortfall_queries(
    cfg: StackConfig, sign: int
) -> list[aws.cloudwatch.MetricAlarmMetricQueryArgs]:
    """`sign` x shortfall (see the module docstring) as CloudWatch metric math."""
    queries, terms = [], []
    for key, group in (("spot", group_name(cfg)), ("od", fallback_group_name(cfg))):
        for metric in (m.value for m in GROUP_METRICS):
            if key == "od" and metric == "GroupDesiredCapacity":
                continue
            qid = f"{key}_{metric.removeprefix('Group').removesuffix('Instances').lower()}"
            terms.append((qid, metric == "GroupDesiredCapacity"))
            queries.append(
                aws.cloudwatch.MetricAlarmMetricQueryArgs(
                    id=qid,
                    metric=aws.cloudwatch.MetricAlarmMetricQueryMetricArgs(
                        namespace="AWS/AutoScaling",
                        metric_name=metric,
                        dimensions={"AutoScalingGroupName": group},
                        period=60,
                        stat="Maximum",
                    ),
                )
            )
    expression = " ".join(
        ("+ " if plus else "- ") + f"FILL({qid}, 0)" for qid, plus in terms
    ).removeprefix("+ ")
    return [
        *queries,
        aws.cloudwatch.MetricAlarmMetricQueryArgs(
            id="shortfall",
            expression=expression if sign > 0 else f"-({expression})",
            label="spot shortfall" if sign > 0 else "surplus over the spot group's desired",
            return_data=True,
        ),
    ]


def steps(cfg: StackConfig, sign: int) -> list[aws.autoscaling.PolicyStepAdjustmentArgs]:
    """k short (or over) -> `sign` x k nodes, for k = 1 .. nodes.max (the alarm's threshold is 1,
    so a metric of k lies k-1 above it)."""
    top = cfg.nodes.max
    return [
        aws.autoscaling.PolicyStepAdjustmentArgs(
            metric_interval_lower_bound=str(k - 1),
            metric_interval_upper_bound=str(k) if k < top else None,
            scaling_adjustment=sign * k,
        )
        for k in range(1, top + 1)
    ]


def register(
    name: str,
    cfg: StackConfig,
    mixed: aws.autoscaling.GroupMixedInstancesPolicyArgs,
    subnet_ids: list[pulumi.Output[str]],
    target: aws.lb.TargetGroup,
    node_tags: dict[str, str],
    tags: dict[str, str],
    child: pulumi.ResourceOptions,
    needs: pulumi.ResourceOptions,
) -> aws.autoscaling.Group:
    """The fallback group, its two policies and their alarms; `mixed`: an on-demand-only
    mixed instances policy over the fallback's launch template."""
    group = scaling.sibling_group(
        f"{name}-od-asg",
        cfg,
        group=fallback_group_name(cfg),
        size=(0, cfg.nodes.max, 0),
        mixed=mixed,
        subnet_ids=subnet_ids,
        target=target,
        node_tags={**node_tags, CAPACITY_TAG[0]: CAPACITY_TAG[1]},
        min_healthy=0,
        child=child,
        needs=needs,
        metrics=True,
        own_desired=True,  # its alarms move the desired size; a deploy must not move it back
    )
    for action, sign, minutes in (("fill", 1, FILL_MINUTES), ("return", -1, RETURN_MINUTES)):
        policy = aws.autoscaling.Policy(
            f"{name}-od-{action}",
            name=f"{cfg.name}-od-{action}",
            autoscaling_group_name=group.name,
            policy_type="StepScaling",
            adjustment_type="ChangeInCapacity",
            metric_aggregation_type="Maximum",
            estimated_instance_warmup=INSTANCE_WARMUP_S,
            step_adjustments=steps(cfg, sign),
            opts=child,
        )
        what = "spot group short" if sign > 0 else "spot group whole again"
        aws.cloudwatch.MetricAlarm(
            f"{name}-od-{action}",
            name=f"{cfg.name}-od-{action}",
            alarm_description=f"torchfleet {cfg.stack}: {what} for {minutes} min: "
            f"{'add on-demand nodes' if sign > 0 else 'remove on-demand nodes'}",
            metric_queries=shortfall_queries(cfg, sign),
            comparison_operator="GreaterThanOrEqualToThreshold",
            threshold=1,
            evaluation_periods=minutes,
            datapoints_to_alarm=minutes,
            treat_missing_data="notBreaching",
            alarm_actions=[policy.arn],
            tags=tags,
            opts=child,
        )
    return group
