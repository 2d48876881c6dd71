"""AWS through boto3 (the bootstrap venv's pins), with the instance role's credentials through
IMDSv2: Auto Scaling lifecycle actions, CloudWatch metrics, S3 downloads, the stack's API token
(Secrets Manager), leaving the ALB's target group (elbv2 DeregisterTargets) before a drain. The
group's view of this node (target lifecycle state) and a spot notice are in the instance
metadata itself."""

from __future__ import annotations

from typing import Any

from . import boot
from .boot import NodeConfig
from .cloud import Identity, Metrics
from .imds import Imds
from .metrics import ALIBABA_ONLY


class Aws:
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.imds = Imds("aws", (cfg.get("endpoints") or {}).get("imds"))
        self._clients: dict[str, Any] = {}

    def identity(self) -> Identity:
        m = self.imds.get
        return {
            "instance_id": self.imds.require("instance-id"),
            "region": m("placement/region") or self.cfg["region"],
            "instance_type": m("instance-type"),
            "spot": m("instance-life-cycle") == "spot",
            "target": m("autoscaling/target-lifecycle-state"),
        }

    def target_state(self) -> str | None:
        return self.imds.get("autoscaling/target-lifecycle-state")

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = boot.aws_client(self.cfg, service)
        return self._clients[service]

    def _hook(self, call: str, hook: str, instance_id: str, **extra: str) -> None:
        getattr(self.client("autoscaling"), call)(
            LifecycleHookName=hook,
            AutoScalingGroupName=self.cfg["group_name"],
            InstanceId=instance_id,
            **extra,
        )

    def lifecycle(self, hook: str, result: str, instance_id: str) -> None:
        self._hook("complete_lifecycle_action", hook, instance_id, LifecycleActionResult=result)

    def heartbeat(self, hook: str, instance_id: str) -> None:
        self._hook("record_lifecycle_action_heartbeat", hook, instance_id)

    def spot_notice(self) -> str | None:
        """The instance-action document once AWS has posted a spot notice (404 before)."""
        return self.imds.get("spot/instance-action")

    def balancer(self, instance_id: str) -> TargetGroup | None:
        arn = self.cfg.get("target_group_arn")
        return TargetGroup(self.client("elbv2"), arn, instance_id) if arn else None

    def secret_string(self, name: str) -> str:
        value: str = self.client("secretsmanager").get_secret_value(SecretId=name)["SecretString"]
        return value

    def put_metrics(self, values: Metrics) -> None:
        dims = [{"Name": "AutoScalingGroupName", "Value": self.cfg["group_name"]}]
        self.client("cloudwatch").put_metric_data(
            Namespace=self.cfg.get("metrics_namespace", "torchfleet"),
            MetricData=[
                {"MetricName": name, "Dimensions": dims, "Value": float(value), "Unit": unit}
                # the load balancer counts each target group's requests, 5xx and latency itself
                for name, (value, unit) in sorted(values.items())
                if name not in ALIBABA_ONLY
            ],
        )


class TargetGroup:
    """This node in the ALB's target group: deregistering stops new requests at once, and the
    group's deregistration delay lets those in flight finish (infra.lifecycle)."""

    def __init__(self, elbv2: Any, arn: str, instance_id: str) -> None:
        self.elbv2, self.arn, self.instance_id = elbv2, arn, instance_id

    def describe(self) -> str:
        return f"target group {self.arn.rsplit(':', 1)[-1]}"

    def leave(self) -> None:
        self.elbv2.deregister_targets(TargetGroupArn=self.arn, Targets=[{"Id": self.instance_id}])
