"""What stops the spending on Alibaba Cloud.

Instances mode: OOS timer-triggered executions of the public templates
ACS-ECS-ScheduleToStopInstances / ACS-ECS-ScheduleToStartInstances, targeting this fleet by tag
with a RAM role that may only start and stop this stack's own instances (by id) and list
instances; the TTL is the instances' own
`auto_release_time` (set by the fleet). Group mode: ESS scheduled tasks (UTC, weekly) resize the
group to zero and back; a one-off task empties it at the TTL."""

from __future__ import annotations

import functools
import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_alicloud as alicloud

from infra.alicloud.fleet import AlicloudFleet, attach_policy
from infra.config import StackConfig
from infra.interface import NODE_ROLE_TAG
from infra.schedule import deploy_time, ess_recurrence, iso_utc, quartz_cron

if TYPE_CHECKING:
    from infra.alicloud.cluster import AckCluster

# ESS refuses recurrences ending more than 365 days after creation; OOS needs an end date too.
MAX_RECURRENCE = timedelta(days=360)
OOS_TEMPLATES = {
    "stop": "ACS-ECS-ScheduleToStopInstances",
    "start": "ACS-ECS-ScheduleToStartInstances",
}


def _assumed(parameters: dict[str, Any], role_name: str) -> str:
    """An OOS execution's parameters with the role it runs as (known once the role exists)."""
    return json.dumps({**parameters, "OOSAssumeRole": role_name})


class AlicloudTeardown(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        fleet: AlicloudFleet | AckCluster,
        expiry: datetime | None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:alicloud:Teardown", name, None, opts)
        self.child = pulumi.ResourceOptions(parent=self)
        self.cfg, self.tags, self.name = cfg, tags, name
        now = deploy_time()
        self.end = expiry or (now + MAX_RECURRENCE)
        if isinstance(fleet, AlicloudFleet):
            if cfg.mode == "instances" and cfg.schedule:
                self._oos_schedules(fleet)
            if cfg.mode == "group":
                self._ess_schedules(fleet, now, expiry)
        else:  # mode: kubernetes, the ACK cluster: its GPU node pool's ESS scaling group
            for pool in fleet.scaled_pools:
                self._group_tasks(
                    f"{name}-{pool.name}",
                    f"{cfg.name}-{pool.name}",
                    pool.group_name,
                    pool.min,
                    pool.max,
                    pool.desired,
                    now,
                    expiry,
                )
        self.register_outputs({})

    def _oos_schedules(self, fleet: AlicloudFleet) -> None:
        cfg, name, child, s = self.cfg, self.name, self.child, self.cfg.schedule
        assert s is not None
        role = alicloud.ram.Role(
            f"{name}-oos",
            role_name=f"{cfg.name}-oos",
            assume_role_policy_document=json.dumps(
                {
                    "Version": "1",
                    "Statement": [
                        {
                            "Action": "sts:AssumeRole",
                            "Effect": "Allow",
                            "Principal": {"Service": ["oos.aliyuncs.com"]},
                        }
                    ],
                }
            ),
            description=f"torchfleet {cfg.stack}: start/stop GPU nodes on schedule",
            force=True,
            tags=self.tags,
            opts=child,
        )
        # The stack's own instances by id: a replaced node is a new id, and the next `up`
        # updates this document with it.
        document = pulumi.Output.all(*[i.id for i in fleet.instances]).apply(
            lambda ids: json.dumps(
                {
                    "Version": "1",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Action": ["ecs:StartInstance", "ecs:StopInstance"],
                            "Resource": [f"acs:ecs:{cfg.region}:*:instance/{i}" for i in ids],
                        },
                        {
                            "Effect": "Allow",
                            "Action": ["ecs:DescribeInstances"],
                            "Resource": ["*"],
                        },
                    ],
                }
            )
        )
        attach = attach_policy(
            f"{name}-oos",
            f"{cfg.name}-oos",
            "start/stop GPU nodes",
            document,
            role.role_name,
            self.tags,
            child,
        )
        targets = {
            "Type": "Tags",
            "RegionId": cfg.region,
            "Tags": [
                {"Key": "stack", "Value": cfg.stack},
                {"Key": NODE_ROLE_TAG[0], "Value": NODE_ROLE_TAG[1]},
            ],
        }
        for action, at, days in (("start", s.start, s.days), ("stop", s.stop, s.stop_days)):
            alicloud.oos.Execution(
                f"{name}-{action}",
                template_name=OOS_TEMPLATES[action],
                mode="Automatic",
                description=f"torchfleet {cfg.stack}: {action} the GPU nodes on schedule",
                parameters=role.role_name.apply(
                    functools.partial(
                        _assumed,
                        {
                            "regionId": cfg.region,
                            "cron": quartz_cron(at, days),
                            "timeZone": s.timezone,
                            "endDate": iso_utc(self.end),
                            "targets": targets,
                        },
                    )
                ),
                tags=self.tags,
                opts=pulumi.ResourceOptions.merge(
                    child, pulumi.ResourceOptions(depends_on=[attach, *fleet.instances])
                ),
            )

    def _ess_schedules(self, fleet: AlicloudFleet, now: datetime, expiry: datetime | None) -> None:
        cfg = self.cfg
        self._group_tasks(
            self.name,
            cfg.name,
            fleet.group.id,
            cfg.nodes.min,
            cfg.nodes.max,
            cfg.nodes.desired,
            now,
            expiry,
        )
        if fleet.candidate_group is not None and cfg.rollout is not None:
            # the rollout's candidate group stops and starts with the stable one, at its size
            n = cfg.rollout.candidate_size(cfg.nodes.min, cfg.nodes.max)
            self._group_tasks(
                f"{self.name}-candidate",
                f"{cfg.name}-candidate",
                fleet.candidate_group.id,
                n,
                n,
                n,
                now,
                expiry,
            )

    def _group_tasks(
        self,
        name: str,
        task_prefix: str,
        group_id: pulumi.Input[str],
        lo: int,
        hi: int,
        desired: int,
        now: datetime,
        expiry: datetime | None,
    ) -> None:
        """Working hours at lo/hi/desired, zero outside them and from the TTL on."""
        cfg, child = self.cfg, self.child
        # ESS wants the first launch within 90 days; later deploys must not churn it.
        keep = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(ignore_changes=["launchTime", "recurrenceEndTime"])
        )
        if cfg.schedule:
            s = cfg.schedule
            plan = (
                ("start", s.start, s.days, lo, hi, desired),
                ("stop", s.stop, s.stop_days, 0, 0, 0),
            )
            for action, at, days, lo_, hi_, desired_ in plan:
                rec = ess_recurrence(s, at, days, now)
                alicloud.ess.ScheduledTask(
                    f"{name}-{action}",
                    scheduled_task_name=f"{task_prefix}-{action}",
                    description=f"working hours: {action} ({s.timezone} {at:%H:%M})",
                    scaling_group_id=group_id,
                    launch_time=rec.launch_time,
                    recurrence_type="Weekly",
                    recurrence_value=rec.weekdays,
                    recurrence_end_time=iso_utc(self.end),
                    min_value=lo_,
                    max_value=hi_,
                    desired_capacity=desired_,
                    task_enabled=True,
                    opts=keep,
                )
        if expiry:
            alicloud.ess.ScheduledTask(
                f"{name}-ttl",
                scheduled_task_name=f"{task_prefix}-ttl",
                description="TTL: empty the group",
                scaling_group_id=group_id,
                launch_time=iso_utc(expiry, seconds=False),
                min_value=0,
                max_value=0,
                desired_capacity=0,
                task_enabled=True,
                opts=child,
            )
