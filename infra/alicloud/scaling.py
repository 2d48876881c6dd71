"""The ESS group's lifecycle hooks and its load-based rules.

Hooks: SCALE_OUT (ABANDON on timeout: the node is released, never served) and SCALE_IN
(CONTINUE on timeout), the same names and timeouts as on AWS.
Rules: ESS target tracking works on CloudMonitor's system metrics only, and neither GPU
saturation nor the CLB's requests per backend is one of them, so the load signals are custom
metrics the node agent publishes (QueueDepth, RequestRate, GpuUtilization: the mean over the
GPUs serving a model replica, in percent; dimension `scaling_group`) to a CloudMonitor
application group, read by ESS alarms that drive step scaling rules:
- scale out: one alarm per signal (>= target for SCALE_OUT_PERIODS minutes), +1 node, +2 at
  twice the target (GPU utilisation: halfway from its target to 100 %);
- scale in: one alarm on both signals at once (&&, for SCALE_IN_PERIODS minutes) below the
  hysteresis threshold, -1 node. As with AWS target tracking, any signal adds nodes and only
  all together remove one.
Forged figures (docs/security.md): CloudMonitor lets any node with cms:PutCustomMetric write
any custom metric, so the alarms never read a mean one node can drag: scale-out fires only when
the Minimum over the group's nodes is above the target, scale-in only when the Maximum is below
the threshold. A single node's figure, however forged, can hold the group where it is, never
move it.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_alicloud as alicloud

from infra.config import StackConfig
from infra.lifecycle import (
    INSTANCE_WARMUP_S,
    METRIC_PERIOD_S,
    SCALE_IN_PERIODS,
    SCALE_OUT_PERIODS,
    queue_depth_target,
    terminate_timeout_s,
)
from infra.nodeboot import GPU_METRIC, LAUNCH_HOOK, QUEUE_METRIC, REQUEST_METRIC, TERMINATE_HOOK

SCALE_OUT_STATISTIC = "Minimum"  # every node above the target, forger or not
SCALE_IN_STATISTIC = "Maximum"  # every node below the threshold


def hooks(cfg: StackConfig) -> list[dict[str, Any]]:
    assert cfg.scaling is not None
    return [
        {
            "name": LAUNCH_HOOK,
            "lifecycle_transition": "SCALE_OUT",
            "default_result": "ABANDON",
            "heartbeat_timeout": cfg.scaling.launch_timeout_s,
        },
        {
            "name": TERMINATE_HOOK,
            "lifecycle_transition": "SCALE_IN",
            "default_result": "CONTINUE",
            "heartbeat_timeout": terminate_timeout_s(cfg.stack),
        },
    ]


def targets(cfg: StackConfig) -> dict[str, float]:
    """Per-node targets by metric: RequestRate in requests/s (the config's per-minute figure),
    GpuUtilization in percent."""
    assert cfg.scaling is not None
    queue = cfg.scaling.queue_depth_per_node or queue_depth_target(
        cfg.stack, cfg.scaling.requests_per_node
    )
    return {
        REQUEST_METRIC: round(cfg.scaling.requests_per_node / 60, 3),
        QUEUE_METRIC: queue,
        GPU_METRIC: cfg.scaling.gpu_utilization_percent,
    }


def second_step(metric: str, target: float) -> float:
    """How far above its target a signal adds two nodes instead of one: at twice the target,
    or, for GPU utilisation (which stops at 100 %), halfway from the target to 100 %."""
    return round((100 - target) / 2, 3) if metric == GPU_METRIC else target


def scale_in_ratio(cfg: StackConfig) -> float:
    """Remove a node only when the others can take its load and stay below target: from n nodes
    to n - 1 the per-node load grows by n / (n - 1); the smallest group a scale-in leaves,
    n - 1 = max(nodes.min, 1), gives the tightest bound."""
    smallest = max(cfg.nodes.min, 1)
    return smallest / (smallest + 1)


def lifecycle_hooks(
    name: str, cfg: StackConfig, group: alicloud.ess.ScalingGroup, child: pulumi.ResourceOptions
) -> list[alicloud.ess.LifecycleHook]:
    return [
        alicloud.ess.LifecycleHook(
            f"{name}-{hook['name'].removeprefix('torchfleet-')}-hook",
            scaling_group_id=group.id,
            **hook,
            opts=child,
        )
        for hook in hooks(cfg)
    ]


def register(
    name: str,
    cfg: StackConfig,
    group: alicloud.ess.ScalingGroup,
    metrics_group: alicloud.cms.MonitorGroup,
    child: pulumi.ResourceOptions,
) -> list[alicloud.ess.ScalingRule]:
    assert cfg.scaling is not None
    cms_group = metrics_group.id.apply(int)
    rules = []
    for metric, target in targets(cfg).items():
        out = alicloud.ess.ScalingRule(
            f"{name}-{metric.lower()}-out",
            scaling_group_id=group.id,
            scaling_rule_name=f"{cfg.name}-{metric.lower()}-out",
            scaling_rule_type="StepScalingRule",
            adjustment_type="QuantityChangeInCapacity",
            estimated_instance_warmup=INSTANCE_WARMUP_S,
            # Bounds are relative to the alarm's threshold (the target).
            step_adjustments=[
                alicloud.ess.ScalingRuleStepAdjustmentArgs(
                    metric_interval_lower_bound="0",
                    metric_interval_upper_bound=str(second_step(metric, target)),
                    scaling_adjustment=1,
                ),
                alicloud.ess.ScalingRuleStepAdjustmentArgs(
                    metric_interval_lower_bound=str(second_step(metric, target)),
                    scaling_adjustment=2,
                ),
            ],
            opts=child,
        )
        alicloud.ess.Alarm(
            f"{name}-{metric.lower()}-high",
            name=f"{cfg.name}-{metric.lower()}-high",
            description=f"{metric} per node >= {target}: add nodes",
            scaling_group_id=group.id,
            alarm_actions=[out.ari],
            metric_type="custom",
            cloud_monitor_group_id=cms_group,
            metric_name=metric,
            statistics=SCALE_OUT_STATISTIC,
            period=METRIC_PERIOD_S,
            evaluation_count=SCALE_OUT_PERIODS,
            comparison_operator=">=",
            threshold=str(target),
            opts=child,
        )
        rules.append(out)
    if cfg.scaling.scale_in:
        ratio = scale_in_ratio(cfg)
        shrink = alicloud.ess.ScalingRule(
            f"{name}-in",
            scaling_group_id=group.id,
            scaling_rule_name=f"{cfg.name}-in",
            scaling_rule_type="StepScalingRule",
            adjustment_type="QuantityChangeInCapacity",
            estimated_instance_warmup=INSTANCE_WARMUP_S,
            step_adjustments=[
                alicloud.ess.ScalingRuleStepAdjustmentArgs(
                    metric_interval_upper_bound="0", scaling_adjustment=-1
                )
            ],
            opts=child,
        )
        alicloud.ess.Alarm(
            f"{name}-low",
            name=f"{cfg.name}-load-low",
            description=f"every signal below {ratio:.2f} x its target: remove a node",
            scaling_group_id=group.id,
            alarm_actions=[shrink.ari],
            metric_type="custom",
            cloud_monitor_group_id=cms_group,
            evaluation_count=SCALE_IN_PERIODS,
            expressions_logic_operator="&&",
            expressions=[
                alicloud.ess.AlarmExpressionArgs(
                    metric_name=metric,
                    statistics=SCALE_IN_STATISTIC,
                    period=METRIC_PERIOD_S,
                    comparison_operator="<",
                    threshold=round(target * ratio, 3),
                )
                for metric, target in targets(cfg).items()
            ],
            opts=child,
        )
        rules.append(shrink)
    return rules
