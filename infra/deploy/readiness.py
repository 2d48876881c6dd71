"""The readiness stage: every node serving before anyone is told the stack is up.

Instances mode: each node's GET /readyz through an SSH tunnel (infra.deploy.access) until it
answers 200 (the runtime answers 200 only once the model is loaded and every batch size is
warmed), then GET /v1/model for what it serves (device, precision, batch cap, warmed sizes).
`probe` does one look without waiting (what `status` shows).

Group mode: the scaling group's nodes converge themselves; the stack is ready when the load
balancer counts as many healthy targets as the group's desired capacity. AWS: elbv2
describe_target_health on the target groups of the endpoint's load balancer, the desired size
from the Auto Scaling group that carries the stack's node tags (its discovery filter).
Alibaba: not read by this version (said so plainly; the smoke prediction still goes through the
endpoint)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from infra import client
from infra.constants import HEALTH_PATH
from infra.deploy.access import SshTarget, tunnel
from infra.deploy.progress import Console
from infra.deploy.stage import StageError

POLL_S = 2.0


@dataclass
class NodeState:
    host: str
    address: str
    readyz: int | None = None
    waited_s: float = 0.0
    model: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ready(self) -> bool:
        return self.readyz == 200

    def describe(self) -> str:
        if self.error:
            return f"unreachable: {self.error}"
        state = "ready" if self.ready else f"NOT ready (/readyz {self.readyz or 'no answer'})"
        m = self.model
        if not m:
            return state
        warmed = m.get("warmed_batch_sizes") or []
        return (
            f"{state}, batch cap {m.get('max_batch_size')}"
            + (f" (warmed {','.join(str(w) for w in warmed)})" if warmed else "")
            + f", {m.get('device')} {m.get('precision')}, torch {m.get('torch_version')}"
        )


def look(base: str, node: NodeState, auth: client.Auth | None = None) -> None:
    node.readyz, _, _ = client.request("GET", base + HEALTH_PATH, timeout=10)
    code, body, _ = client.request("GET", base + "/v1/model", timeout=10, auth=auth)
    if code == 200:
        try:
            node.model = json.loads(body)
        except ValueError:
            node.model = {}


def wait_node(
    target: SshTarget,
    service_port: int,
    timeout_s: float,
    stage: str = "readiness",
    auth: client.Auth | None = None,
) -> NodeState:
    node = NodeState(target.host, target.address)
    started = time.monotonic()
    with tunnel(target, service_port, stage) as base:
        while True:
            look(base, node, auth)
            node.waited_s = time.monotonic() - started
            if node.ready or node.waited_s >= timeout_s:
                return node
            time.sleep(POLL_S)


def probe(target: SshTarget, service_port: int, auth: client.Auth | None = None) -> NodeState:
    """One look, no waiting; an unreachable node is a state, not an error."""
    try:
        return wait_node(target, service_port, 0, stage="status", auth=auth)
    except StageError as err:
        return NodeState(target.host, target.address, error=err.message)


def wait_instances(
    targets: list[SshTarget],
    service_port: int,
    console: Console,
    timeout_s: float,
    auth: client.Auth | None = None,
) -> list[NodeState]:
    nodes = []
    width = max([len(t.host) for t in targets] + [4])
    for target in targets:
        node = wait_node(target, service_port, timeout_s, auth=auth)
        nodes.append(node)
        console.line(
            f"  {node.host:<{width}}  /readyz {node.readyz or 'no answer'} after "
            f"{node.waited_s:.1f} s  {node.describe()}"
        )
        if not node.ready:
            raise StageError(
                "readiness",
                f"/readyz on {node.host} did not answer 200 within "
                f"{timeout_s:.0f} s (last: {node.readyz or 'no answer'})",
                host=node.host,
                fix=f"look at the runtime's log on the node (`journalctl -u torchfleet-runtime` "
                f"on {node.address}), then re-run; --ready-timeout waits longer",
            )
    return nodes


# -- group mode --------------------------------------------------------------------------------


@dataclass
class GroupHealth:
    healthy: int
    desired: int
    states: dict[str, str]


def aws_group_health(
    stack: str, outputs: dict[str, Any], client: Callable[..., Any] | None = None
) -> GroupHealth:
    """Healthy targets behind the endpoint's load balancer, against the group's desired size."""
    if client is None:
        import boto3

        client = boto3.client
    discovery = outputs.get("discovery") or {}
    region = discovery.get("region")
    dns = (urlsplit(str(outputs.get("endpoint") or "")).hostname or "").lower()
    elb = client("elbv2", region_name=region)
    lb_arn = None
    for page in elb.get_paginator("describe_load_balancers").paginate():
        for lb in page["LoadBalancers"]:
            if lb["DNSName"].lower() == dns:
                lb_arn = lb["LoadBalancerArn"]
    if lb_arn is None:
        raise StageError(
            "readiness",
            f"no load balancer in {region} has the endpoint's DNS name {dns!r}",
            fix="check the stack's endpoint output and the region",
        )
    states: dict[str, str] = {}
    for tg in elb.describe_target_groups(LoadBalancerArn=lb_arn)["TargetGroups"]:
        health = elb.describe_target_health(TargetGroupArn=tg["TargetGroupArn"])
        for d in health["TargetHealthDescriptions"]:
            states[d["Target"]["Id"]] = d["TargetHealth"]["State"]
    filters = [
        {"Name": key, "Values": [value]}
        for key, value in (discovery.get("filters") or {}).items()
        if key.startswith("tag:")
    ] or [{"Name": "tag:stack", "Values": [stack]}]
    asg = client("autoscaling", region_name=region)
    groups = asg.describe_auto_scaling_groups(Filters=filters)["AutoScalingGroups"]
    if not groups:
        raise StageError(
            "readiness",
            f"no Auto Scaling group in {region} carries the tags {filters}",
            fix="check the stack's discovery output and the region",
        )
    # the on-demand fallback group fills what the spot group lacks: the spot group's desired
    # size is the target (infra.aws.fallback)
    fallback = discovery.get("fallback_group_name")
    desired = sum(
        int(g["DesiredCapacity"]) for g in groups if g["AutoScalingGroupName"] != fallback
    )
    return GroupHealth(sum(s == "healthy" for s in states.values()), desired, states)


def wait_group(
    stack: str,
    cloud: str,
    outputs: dict[str, Any],
    console: Console,
    timeout_s: float,
    poll_s: float = 15.0,
    client: Callable[..., Any] | None = None,
) -> GroupHealth | None:
    if cloud != "aws":
        console.line(
            "  group mode on alicloud: this version does not read the SLB's backend "
            "health; check it with `aliyun slb DescribeHealthStatus` (the smoke "
            "prediction below still goes through the endpoint)"
        )
        return None
    started = time.monotonic()
    last = None
    while True:
        health = aws_group_health(stack, outputs, client)
        if (health.healthy, health.desired) != last:
            console.line(
                f"  {health.healthy}/{health.desired} healthy targets "
                f"({', '.join(f'{k} {v}' for k, v in sorted(health.states.items())) or 'none registered'})"
                f" after {time.monotonic() - started:.0f} s"
            )
            last = (health.healthy, health.desired)
        if health.desired and health.healthy >= health.desired:
            return health
        if time.monotonic() - started >= timeout_s:
            raise StageError(
                "readiness",
                f"the group reached {health.healthy}/{health.desired} healthy "
                f"targets in {timeout_s:.0f} s",
                details=[f"{k}: {v}" for k, v in sorted(health.states.items())],
                fix="a node that never turns healthy failed its own converge: look at its "
                "cloud-init log (/var/log/cloud-init-output.log), then re-run",
            )
        time.sleep(poll_s)
