"""Alibaba Cloud through its official SDKs (the bootstrap venv's pins), with the ECS RAM role's
STS credentials from the metadata service (alibabacloud-credentials): Auto Scaling (ESS API
2022-02-22) lifecycle actions, CloudMonitor custom metrics, OSS downloads, the stack's API token
(KMS secret, API 2016-01-20) and leaving the CLB (SLB API 2014-05-15: the node's weight 0 in
the VServer group the listeners forward to, SetVServerGroupAttribute) before a drain. KMS and
SLB go through the OpenAPI SDK's own client (`call_api`, the signed RPC call each product SDK
wraps: alibabacloud_slb20140515's set_vserver_group_attribute is this call), which the bootstrap
venv already pins: two more product SDKs on every node Python for one call each were not worth
their pins.

ECS metadata has no target lifecycle state: the group's view of this node comes from ESS
(DescribeScalingInstances). ESS hands lifecycle action tokens out per scaling activity, so
completing an action means finding it: the node's own activity first, then the group's
activities in progress."""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from typing import Any

from alibabacloud_cms20190101 import models as cms_models
from alibabacloud_cms20190101.client import Client as CmsClient
from alibabacloud_ess20220222 import models as ess_models
from alibabacloud_ess20220222.client import Client as EssClient
from alibabacloud_tea_openapi.models import Config

from . import boot
from .boot import NodeConfig
from .cloud import Identity, Metrics
from .imds import Imds
from .secret_files import KMS_VERSION, openapi_rpc

HEARTBEAT_TIMEOUT_S = 600  # what each heartbeat extends the launch action to
RPC_VERSIONS = {"kms": KMS_VERSION, "slb": "2014-05-15"}


def _target(
    instance: ess_models.DescribeScalingInstancesResponseBodyScalingInstances | None,
) -> str | None:
    """The group's lifecycle state of this node as the AWS agent reads it from IMDS."""
    if instance is None:
        return None
    return (
        "Terminated" if instance.lifecycle_state in ("Removing:Wait", "Removing") else "InService"
    )


class Alicloud:
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg, self.region = cfg, cfg["region"]
        self.endpoints = cfg.get("endpoints") or {}
        self.imds = Imds("alicloud", self.endpoints.get("imds"))
        self._credentials = boot.alibaba_credentials(cfg)
        self._ess: EssClient | None = None
        self._cms: CmsClient | None = None
        self._ids: dict[str, str] = {}

    def _config(self, service: str) -> Config:
        """The SDK's own endpoint for the region, or the override (scheme, host and port)."""
        config = Config(credential=self._credentials, region_id=self.region)
        override = self.endpoints.get(service)
        if override:
            url = urllib.parse.urlsplit(override)
            config.endpoint, config.protocol = url.netloc, url.scheme
        elif service in RPC_VERSIONS:  # the generic client has no endpoint table of its own
            config.endpoint = f"{service}.{self.region}.aliyuncs.com"
        return config

    def rpc(self, service: str, action: str, query: dict[str, str]) -> dict[str, Any]:
        """One signed RPC call of `service` (kms, slb) through the OpenAPI client."""
        return openapi_rpc(self._config(service), action, RPC_VERSIONS[service], query)

    def spot_notice(self) -> str | None:
        """The release time once ECS has posted a spot notice (404 before)."""
        return self.imds.get("instance/spot/termination-time")

    def balancer(self, instance_id: str) -> ClbBackend | None:
        lb, group = self.cfg.get("load_balancer_id"), self.cfg.get("vserver_group_id")
        return ClbBackend(self, lb, group, instance_id) if lb and group else None

    def secret_string(self, name: str) -> str:
        found = self.rpc("kms", "GetSecretValue", {"SecretName": name})
        return str(found["SecretData"])

    @property
    def ess(self) -> EssClient:
        if self._ess is None:
            self._ess = EssClient(self._config("ess"))
        return self._ess

    @property
    def cms(self) -> CmsClient:
        if self._cms is None:
            self._cms = CmsClient(self._config("cms"))
        return self._cms

    def identity(self) -> Identity:
        m = self.imds.get
        ident: Identity = {
            "instance_id": self.imds.require("instance-id"),
            "region": m("region-id") or self.region,
            "instance_type": m("instance/instance-type"),
            "spot": None,
            "target": None,
        }
        if self.cfg.get("group_name"):
            inst = self.scaling_instance(ident["instance_id"])
            ident["spot"] = (inst.spot_strategy if inst else None) not in (None, "", "NoSpot")
            ident["target"] = _target(inst)
        return ident

    def group_id(self) -> str:
        if "group" not in self._ids:
            given = self.cfg.get("group_id")
            if given:
                self._ids["group"] = given
            else:
                found = self.ess.describe_scaling_groups(
                    ess_models.DescribeScalingGroupsRequest(
                        region_id=self.region, scaling_group_name=self.cfg["group_name"]
                    )
                ).body.scaling_groups
                if not found:
                    raise RuntimeError(
                        f"no scaling group {self.cfg['group_name']} in {self.region}"
                    )
                self._ids["group"] = found[0].scaling_group_id
        return self._ids["group"]

    def scaling_instance(
        self, instance_id: str
    ) -> ess_models.DescribeScalingInstancesResponseBodyScalingInstances | None:
        found = self.ess.describe_scaling_instances(
            ess_models.DescribeScalingInstancesRequest(
                region_id=self.region, scaling_group_id=self.group_id(), instance_ids=[instance_id]
            )
        ).body.scaling_instances
        return found[0] if found else None

    def target_state(self) -> str | None:
        return _target(self.scaling_instance(self.imds.require("instance-id")))

    def _hook_id(self, hook: str) -> str:
        if hook not in self._ids:
            found = self.ess.describe_lifecycle_hooks(
                ess_models.DescribeLifecycleHooksRequest(
                    region_id=self.region,
                    scaling_group_id=self.group_id(),
                    lifecycle_hook_name=hook,
                )
            ).body.lifecycle_hooks
            if not found:
                raise RuntimeError(f"scaling group {self.group_id()} has no lifecycle hook {hook}")
            self._ids[hook] = found[0].lifecycle_hook_id
        return self._ids[hook]

    def _action(self, hook: str, instance_id: str) -> tuple[str, str]:
        """(hook id, token) of the pending action of `hook` for this node."""
        hook_id = self._hook_id(hook)
        own = self.scaling_instance(instance_id)
        in_progress = (
            self.ess.describe_scaling_activities(
                ess_models.DescribeScalingActivitiesRequest(
                    region_id=self.region,
                    scaling_group_id=self.group_id(),
                    status_code="InProgress",
                    page_size=50,
                )
            ).body.scaling_activities
            or []
        )
        activities: list[str] = [own.scaling_activity_id] if own and own.scaling_activity_id else []
        activities += [a.scaling_activity_id for a in in_progress if a.scaling_activity_id]
        for activity in dict.fromkeys(activities):
            actions = (
                self.ess.describe_lifecycle_actions(
                    ess_models.DescribeLifecycleActionsRequest(
                        region_id=self.region,
                        scaling_activity_id=activity,
                        lifecycle_action_status="Pending",
                        max_results=50,
                    )
                ).body.lifecycle_actions
                or []
            )
            for action in actions:
                if action.lifecycle_hook_id == hook_id and instance_id in (
                    action.instance_ids or []
                ):
                    return hook_id, action.lifecycle_action_token
        raise RuntimeError(f"no pending {hook} action for {instance_id}")

    def lifecycle(self, hook: str, result: str, instance_id: str) -> None:
        hook_id, token = self._action(hook, instance_id)
        self.ess.complete_lifecycle_action(
            ess_models.CompleteLifecycleActionRequest(
                region_id=self.region,
                lifecycle_hook_id=hook_id,
                lifecycle_action_token=token,
                lifecycle_action_result=result,
                client_token=uuid.uuid4().hex,
            )
        )

    def heartbeat(self, hook: str, instance_id: str) -> None:
        hook_id, token = self._action(hook, instance_id)
        self.ess.record_lifecycle_action_heartbeat(
            ess_models.RecordLifecycleActionHeartbeatRequest(
                region_id=self.region,
                lifecycle_hook_id=hook_id,
                lifecycle_action_token=token,
                heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
            )
        )

    def put_metrics(self, values: Metrics) -> None:
        """To the stack's CloudMonitor application group, keyed the way ESS alarms on custom
        metrics match a group (dimension `scaling_group`)."""
        stamp = str(int(time.time() * 1000))
        dimensions = json.dumps({"scaling_group": self.group_id()})
        metrics: list[Any] = [
            cms_models.PutCustomMetricRequestMetricList(
                metric_name=name,
                type="0",  # a raw value, not a statistic
                group_id=self.cfg.get("metrics_group_id") or "0",
                time=stamp,
                dimensions=dimensions,
                values=json.dumps({"value": float(value)}),
            )
            for name, (value, _unit) in sorted(values.items())
        ]
        self.cms.put_custom_metric(cms_models.PutCustomMetricRequest(metric_list=metrics))


class ClbBackend:
    """This node among the backend servers of the CLB's VServer group the listeners forward to
    (ESS attached it there, at the service port): weight 0 stops new requests, those in flight
    finish; ESS removes the server when the instance leaves the group."""

    def __init__(
        self, cloud: Alicloud, load_balancer_id: str, vserver_group_id: str, instance_id: str
    ) -> None:
        self.cloud, self.lb, self.group = cloud, load_balancer_id, vserver_group_id
        self.instance_id = instance_id

    def describe(self) -> str:
        return f"VServer group {self.group} of load balancer {self.lb}"

    def leave(self) -> None:
        port = str(self.cloud.cfg.get("service_port", 8080))
        servers = [{"ServerId": self.instance_id, "Port": port, "Weight": "0", "Type": "ecs"}]
        self.cloud.rpc(
            "slb",
            "SetVServerGroupAttribute",
            {
                "RegionId": self.cloud.region,
                "VServerGroupId": self.group,
                "BackendServers": json.dumps(servers),
            },
        )
