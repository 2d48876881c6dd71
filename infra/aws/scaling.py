"""The Auto Scaling group's lifecycle hooks and its load-based policies.

Hooks: launching (ABANDON on timeout: a node that never reported ready is replaced, never
served) and terminating (CONTINUE on timeout: a node that cannot report its drain still goes);
both are also the group's `initial_lifecycle_hooks` so the first nodes get them.
Policies: three target-tracking policies, on the ALB's requests per target, on the runtime's
queue depth per node and on the node's GPU utilisation (both published by the node agent, as
torchfleet/QueueDepth and torchfleet/GpuUtilization by AutoScalingGroupName; the GPU figure is
the mean over the GPUs that serve a model replica, `scaling.gpu_utilization_percent` its target).
The group scales out when any is above its target and in only when all are below;
`scaling.scale_in: false` makes them out-only.
Forged figures (docs/security.md): any node of the stack may write the torchfleet namespace, so
the two node-published policies track the Minimum over the group's nodes, not the Average: one
node writing a huge figure cannot scale the group out (the honest nodes' figures hold the
minimum), and a low one can only join a scale-in the ALB's own figure (which no node writes)
already asks for.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.lifecycle import (
    HEALTH_GRACE_S,
    INSTANCE_WARMUP_S,
    queue_depth_target,
    terminate_timeout_s,
)
from infra.nodeboot import (
    GPU_METRIC,
    LAUNCH_HOOK,
    METRICS_NAMESPACE,
    QUEUE_METRIC,
    TERMINATE_HOOK,
    group_name,
)

# The node-published figures' statistic (infra.grants: PutMetricData takes no resource).
FORGE_PROOF_STATISTIC = "Minimum"

# A group's own 1-minute size metrics (free), which the on-demand fallback's alarms read.
GROUP_METRICS = (
    aws.autoscaling.Metric.GROUP_DESIRED_CAPACITY,
    aws.autoscaling.Metric.GROUP_IN_SERVICE_INSTANCES,
    aws.autoscaling.Metric.GROUP_PENDING_INSTANCES,
)


def hooks(cfg: StackConfig) -> list[dict[str, Any]]:
    assert cfg.scaling is not None
    return [
        {
            "name": LAUNCH_HOOK,
            "lifecycle_transition": "autoscaling:EC2_INSTANCE_LAUNCHING",
            "default_result": "ABANDON",
            "heartbeat_timeout": cfg.scaling.launch_timeout_s,
        },
        {
            "name": TERMINATE_HOOK,
            "lifecycle_transition": "autoscaling:EC2_INSTANCE_TERMINATING",
            "default_result": "CONTINUE",
            "heartbeat_timeout": terminate_timeout_s(cfg.stack),
        },
    ]


def sibling_group(
    name: str,
    cfg: StackConfig,
    *,
    group: str,
    size: tuple[int, int, int],
    mixed: aws.autoscaling.GroupMixedInstancesPolicyArgs,
    subnet_ids: list[pulumi.Output[str]],
    target: aws.lb.TargetGroup,
    node_tags: dict[str, str],
    min_healthy: int,
    child: pulumi.ResourceOptions,
    needs: pulumi.ResourceOptions,
    metrics: bool = False,
    own_desired: bool = False,
) -> aws.autoscaling.Group:
    """A group of the stack's nodes beside its main one (`name`: the resource, `group`: the
    fixed name the nodes' user-data reports to): `size` (min, max, desired), the same subnets,
    ELB health check, lifecycle hooks (initial and as resources) and rolling instance refresh,
    its nodes registered in `target` only. Two are built: the on-demand fallback
    (infra.aws.fallback: its alarms own the desired size, `own_desired`) and the rollout's
    candidate group (infra.aws.fleet: the split declares its size). `metrics`: the group's
    1-minute size metrics (the fallback's alarms read them)."""
    low, high, desired = size
    out = aws.autoscaling.Group(
        name,
        name=group,
        min_size=low,
        max_size=high,
        desired_capacity=desired,
        vpc_zone_identifiers=subnet_ids,
        health_check_type="ELB",
        health_check_grace_period=HEALTH_GRACE_S,
        default_instance_warmup=INSTANCE_WARMUP_S,
        target_group_arns=[target.arn],
        initial_lifecycle_hooks=[
            aws.autoscaling.GroupInitialLifecycleHookArgs(**hook) for hook in hooks(cfg)
        ],
        mixed_instances_policy=mixed,
        enabled_metrics=list(GROUP_METRICS) if metrics else None,
        metrics_granularity="1Minute" if metrics else None,
        instance_refresh=aws.autoscaling.GroupInstanceRefreshArgs(
            strategy="Rolling",
            preferences=aws.autoscaling.GroupInstanceRefreshPreferencesArgs(
                min_healthy_percentage=min_healthy, skip_matching=True, auto_rollback=True
            ),
        ),
        tags=[
            aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=True)
            for k, v in node_tags.items()
        ],
        opts=pulumi.ResourceOptions.merge(
            needs,
            pulumi.ResourceOptions(ignore_changes=["desiredCapacity"] if own_desired else None),
        ),
    )
    lifecycle_hooks(name.removesuffix("-asg"), cfg, out, child)
    return out


def queue_target(cfg: StackConfig) -> float:
    assert cfg.scaling is not None
    return cfg.scaling.queue_depth_per_node or queue_depth_target(
        cfg.stack, cfg.scaling.requests_per_node
    )


def lifecycle_hooks(
    name: str, cfg: StackConfig, group: aws.autoscaling.Group, child: pulumi.ResourceOptions
) -> None:
    """The hooks as resources of their own, which keep them up to date after the group's
    creation (its `initial_lifecycle_hooks` serve its first nodes only)."""
    for hook in hooks(cfg):
        aws.autoscaling.LifecycleHook(
            f"{name}-{hook['name'].removeprefix('torchfleet-')}-hook",
            autoscaling_group_name=group.name,
            **hook,
            opts=child,
        )


def register(
    name: str,
    cfg: StackConfig,
    group: aws.autoscaling.Group,
    alb: aws.lb.LoadBalancer,
    target: aws.lb.TargetGroup,
    child: pulumi.ResourceOptions,
) -> list[aws.autoscaling.Policy]:
    assert cfg.scaling is not None
    lifecycle_hooks(name, cfg, group, child)
    disable_in = not cfg.scaling.scale_in
    requests = aws.autoscaling.Policy(
        f"{name}-requests",
        name=f"{cfg.name}-requests-per-node",
        autoscaling_group_name=group.name,
        policy_type="TargetTrackingScaling",
        target_tracking_configuration=aws.autoscaling.PolicyTargetTrackingConfigurationArgs(
            target_value=cfg.scaling.requests_per_node,
            disable_scale_in=disable_in,
            predefined_metric_specification=aws.autoscaling.PolicyTargetTrackingConfigurationPredefinedMetricSpecificationArgs(
                predefined_metric_type="ALBRequestCountPerTarget",
                resource_label=pulumi.Output.concat(alb.arn_suffix, "/", target.arn_suffix),
            ),
        ),
        opts=child,
    )
    custom = [
        ("queue", "queue-depth-per-node", QUEUE_METRIC, queue_target(cfg), "Count"),
        ("gpu", "gpu-utilization", GPU_METRIC, cfg.scaling.gpu_utilization_percent, "Percent"),
    ]
    return [requests] + [
        aws.autoscaling.Policy(
            f"{name}-{suffix}",
            name=f"{cfg.name}-{policy}",
            autoscaling_group_name=group.name,
            policy_type="TargetTrackingScaling",
            target_tracking_configuration=aws.autoscaling.PolicyTargetTrackingConfigurationArgs(
                target_value=target,
                disable_scale_in=disable_in,
                customized_metric_specification=aws.autoscaling.PolicyTargetTrackingConfigurationCustomizedMetricSpecificationArgs(
                    namespace=METRICS_NAMESPACE,
                    metric_name=metric,
                    statistic=FORGE_PROOF_STATISTIC,
                    unit=unit,
                    metric_dimensions=[
                        aws.autoscaling.PolicyTargetTrackingConfigurationCustomizedMetricSpecificationMetricDimensionArgs(
                            name="AutoScalingGroupName", value=group_name(cfg)
                        )
                    ],
                ),
            ),
            opts=child,
        )
        for suffix, policy, metric, target, unit in custom
    ]
