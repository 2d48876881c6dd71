"""What stops the spending on AWS: working-hours schedules, the dev TTL and a budget alert.

Instances mode uses EventBridge Scheduler (universal targets call ec2:Start/Stop/Terminate
with a role that may touch only this fleet's instances); group mode uses Auto Scaling
scheduled actions, which keep the group in charge of its instances."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra.aws.fleet import AwsFleet
from infra.config import StackConfig
from infra.cost import estimate
from infra.schedule import eventbridge_cron, iso_utc, unix_cron

if TYPE_CHECKING:
    from infra.aws.cluster import EksCluster

EC2_ACTIONS = {
    "start": "arn:aws:scheduler:::aws-sdk:ec2:startInstances",
    "stop": "arn:aws:scheduler:::aws-sdk:ec2:stopInstances",
    "terminate": "arn:aws:scheduler:::aws-sdk:ec2:terminateInstances",
    "cancel": "arn:aws:scheduler:::aws-sdk:ec2:cancelSpotInstanceRequests",
}
# A persistent spot request outlives its instance: terminated alone, the request re-opens and
# launches a replacement. The TTL cancels the requests first (cancelling leaves the instances
# running) and terminates the instances this long after.
TTL_TERMINATE_AFTER = timedelta(minutes=5)


def _at(when: datetime) -> str:
    return f"at({when.strftime('%Y-%m-%dT%H:%M:%S')})"


class AwsTeardown(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        fleet: AwsFleet | EksCluster,
        expiry: datetime | None,
        arn_partition: str,
        account: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:aws:Teardown", name, None, opts)
        self.child = pulumi.ResourceOptions(parent=self)
        self.cfg, self.tags, self.name = cfg, tags, name
        if isinstance(fleet, AwsFleet):
            if cfg.mode == "instances" and (cfg.schedule or expiry):
                self._instance_schedules(fleet, expiry, arn_partition, account)
            if cfg.mode == "group":
                self._group_schedules(fleet, expiry)
        else:  # mode: kubernetes, the EKS cluster: its GPU node groups' Auto Scaling groups
            for pool in fleet.scaled_pools:
                self._asg_schedules(
                    f"{name}-{pool.name}", pool.group_name, pool.min, pool.max, pool.desired, expiry
                )
        if cfg.budget:
            self._budget()
        self.register_outputs({})

    def _instance_schedules(
        self,
        fleet: AwsFleet,
        expiry: datetime | None,
        arn_partition: str,
        account: pulumi.Input[str],
    ) -> None:
        cfg, name, child = self.cfg, self.name, self.child
        ids = pulumi.Output.all(*[i.id for i in fleet.instances])
        arns = pulumi.Output.all(*[i.arn for i in fleet.instances])
        persistent = fleet.persistent_spot
        requests = pulumi.Output.all(*[i.spot_instance_request_id for i in fleet.instances])
        request_arns = pulumi.Output.all(account, requests).apply(
            lambda v: [
                f"arn:{arn_partition}:ec2:{cfg.region}:{v[0]}:spot-instances-request/{r}"
                for r in v[1]
            ]
        )
        role = aws.iam.Role(
            f"{name}-scheduler",
            description=f"torchfleet {cfg.stack}: start/stop/expire nodes",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "scheduler.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
            tags=self.tags,
            opts=child,
        )

        def grants(values: list) -> str:
            statements = [
                {
                    "Effect": "Allow",
                    "Action": ["ec2:StartInstances", "ec2:StopInstances", "ec2:TerminateInstances"],
                    "Resource": list(values[0]),
                }
            ]
            if persistent and expiry:
                statements.append(
                    {
                        "Effect": "Allow",
                        "Action": ["ec2:CancelSpotInstanceRequests"],
                        "Resource": list(values[1]),
                    }
                )
            return json.dumps({"Version": "2012-10-17", "Statement": statements})

        aws.iam.RolePolicy(
            f"{name}-scheduler",
            role=role.id,
            policy=pulumi.Output.all(arns, request_arns).apply(grants),
            opts=child,
        )
        group = aws.scheduler.ScheduleGroup(
            f"{name}-group", name_prefix=f"{cfg.name}-", tags=self.tags, opts=child
        )
        end = iso_utc(expiry) if expiry else None

        def schedule(
            suffix: str,
            expression: str,
            tz: str,
            action: str,
            target_input: pulumi.Output[str] | None = None,
            **extra: Any,
        ) -> None:
            what = "the GPU nodes' spot requests" if action == "cancel" else "the GPU nodes"
            aws.scheduler.Schedule(
                f"{name}-{suffix}",
                group_name=group.name,
                description=f"torchfleet {cfg.stack}: {action} {what}",
                schedule_expression=expression,
                schedule_expression_timezone=tz,
                flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
                target=aws.scheduler.ScheduleTargetArgs(
                    arn=EC2_ACTIONS[action],
                    role_arn=role.arn,
                    input=target_input or ids.apply(lambda i: json.dumps({"InstanceIds": list(i)})),
                ),
                opts=child,
                **extra,
            )

        if cfg.schedule:
            s = cfg.schedule
            schedule("start", eventbridge_cron(s.start, s.days), s.timezone, "start", end_date=end)
            schedule(
                "stop", eventbridge_cron(s.stop, s.stop_days), s.timezone, "stop", end_date=end
            )
        if expiry:
            terminate_at = expiry
            if persistent:
                schedule(
                    "ttl-spot",
                    _at(expiry),
                    "UTC",
                    "cancel",
                    target_input=requests.apply(
                        lambda r: json.dumps({"SpotInstanceRequestIds": list(r)})
                    ),
                    action_after_completion="DELETE",
                )
                terminate_at = expiry + TTL_TERMINATE_AFTER
            schedule("ttl", _at(terminate_at), "UTC", "terminate", action_after_completion="DELETE")

    def _group_schedules(self, fleet: AwsFleet, expiry: datetime | None) -> None:
        cfg = self.cfg
        self._asg_schedules(
            self.name, fleet.group.name, cfg.nodes.min, cfg.nodes.max, cfg.nodes.desired, expiry
        )
        if fleet.fallback_group is not None:  # 0..max while working: its alarms size it
            self._asg_schedules(
                f"{self.name}-od", fleet.fallback_group.name, 0, cfg.nodes.max, 0, expiry
            )
        if fleet.candidate_group is not None and cfg.rollout is not None:
            # a rollout's candidate group: the split's size while working, 0 outside and after
            n = cfg.rollout.candidate_size(cfg.nodes.min, cfg.nodes.max)
            self._asg_schedules(
                f"{self.name}-candidate", fleet.candidate_group.name, n, n, n, expiry
            )

    def _asg_schedules(
        self,
        name: str,
        group: pulumi.Input[str],
        lo: int,
        hi: int,
        desired: int,
        expiry: datetime | None,
    ) -> None:
        """Working hours at lo/hi/desired, zero outside them and from the TTL on."""
        cfg, child = self.cfg, self.child
        end = iso_utc(expiry) if expiry else None
        if cfg.schedule:
            s = cfg.schedule
            aws.autoscaling.Schedule(
                f"{name}-start",
                autoscaling_group_name=group,
                scheduled_action_name="work-start",
                recurrence=unix_cron(s.start, s.days),
                time_zone=s.timezone,
                min_size=lo,
                max_size=hi,
                desired_capacity=desired,
                end_time=end,
                opts=child,
            )
            aws.autoscaling.Schedule(
                f"{name}-stop",
                autoscaling_group_name=group,
                scheduled_action_name="work-stop",
                recurrence=unix_cron(s.stop, s.stop_days),
                time_zone=s.timezone,
                min_size=0,
                max_size=0,
                desired_capacity=0,
                end_time=end,
                opts=child,
            )
        if expiry:
            aws.autoscaling.Schedule(
                f"{name}-ttl",
                autoscaling_group_name=group,
                scheduled_action_name="ttl-expiry",
                start_time=iso_utc(expiry),
                min_size=0,
                max_size=0,
                desired_capacity=0,
                opts=child,
            )

    def _budget(self) -> None:
        cfg = self.cfg
        assert cfg.budget is not None
        # auto: the whole bill at the largest size scaling may reach, plus 10 %; where spot falls
        # back to on-demand, the GPU nodes at their on-demand price (spot may not be had).
        cost = estimate(cfg)
        worst = cost.monthly_worst_at_max
        if cfg.spot.enabled and cfg.spot.fallback == "on_demand":
            od = cost.max_nodes * cfg.on_demand_price(cfg.instance_type) * cost.hours_per_month
            worst = max(worst, od + cost.rest_per_month)
        limit = cfg.budget.monthly_usd or max(1.0, math.ceil(worst * 1.1))
        notify = [
            aws.budgets.BudgetNotificationArgs(
                comparison_operator="GREATER_THAN",
                threshold=cfg.budget.threshold_percent,
                threshold_type="PERCENTAGE",
                notification_type=kind,
                subscriber_email_addresses=list(cfg.budget.alert_emails),
            )
            for kind in ("FORECASTED", "ACTUAL")
        ]
        aws.budgets.Budget(
            f"{self.name}-budget",
            name_prefix=f"{cfg.name}-",
            budget_type="COST",
            limit_amount=f"{limit:.2f}",
            limit_unit=cfg.currency,
            time_unit="MONTHLY",
            # Counts once `stack` is an active cost allocation tag: `torchfleet up` activates it
            # (infra.spend), and billing sees a new tag within a day.
            cost_filters=[
                aws.budgets.BudgetCostFilterArgs(
                    name="TagKeyValue", values=[f"user:stack${cfg.stack}"]
                )
            ],
            notifications=notify,
            tags=self.tags,
            opts=self.child,
        )
