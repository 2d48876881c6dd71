"""The self-healing alarms of an instance the stack runs by itself (infra.healing decides which):
CloudWatch alarms on the instance's status checks whose actions are EC2's own `recover` and
`reboot` (no Lambda, no role: CloudWatch performs them)."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra import healing
from infra.catalog import HostType, InstanceType
from infra.config import StackConfig

METRICS = {
    healing.RECOVER: ("StatusCheckFailed_System", healing.RECOVER_MINUTES),
    healing.REBOOT: ("StatusCheckFailed_Instance", healing.REBOOT_MINUTES),
}


def action_arn(partition: str, region: str, action: str) -> str:
    return f"arn:{partition}:automate:{region}:ec2:{action}"


def register(
    name: str,
    cfg: StackConfig,
    node: str,
    instance: aws.ec2.Instance,
    itype: InstanceType | HostType,
    spot: bool,
    partition: str,
    opts: pulumi.ResourceOptions,
    tags: dict[str, str],
) -> list[aws.cloudwatch.MetricAlarm]:
    """One alarm per action `node` gets; `name` prefixes the resource names."""
    alarms = []
    for action in healing.for_instance("aws", itype, spot).actions:
        metric, minutes = METRICS[action]
        alarms.append(
            aws.cloudwatch.MetricAlarm(
                f"{name}-{action}",
                name=f"{cfg.name}-{node}-{action}",
                alarm_description=f"torchfleet {cfg.stack}: {action} {node} on {metric}",
                namespace="AWS/EC2",
                metric_name=metric,
                dimensions={"InstanceId": instance.id},
                statistic="Maximum",
                period=60,
                evaluation_periods=minutes,
                threshold=1,
                comparison_operator="GreaterThanOrEqualToThreshold",
                # a stopped instance (the schedule) reports nothing: no action, no alarm
                treat_missing_data="missing",
                alarm_actions=[action_arn(partition, cfg.region, action)],
                tags=tags,
                opts=opts,
            )
        )
    return alarms
