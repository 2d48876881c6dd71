"""The one small interface every cloud implements: network, fleet and teardown components
composed by a `deploy` function that returns what the stack exports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi

from infra import edge
from infra.catalog import InstanceType
from infra.config import StackConfig


@dataclass
class Node:
    """One host of an instances-mode fleet, as the inventory needs it."""

    name: str
    instance_type: InstanceType
    spot: bool
    public_ip: pulumi.Output[str]
    private_ip: pulumi.Output[str]


@dataclass
class MonitoringHost:
    """The stack's monitoring host (roles/monitoring), as the inventory's `monitoring` group
    needs it: reached on its private address (it has no public one)."""

    name: str
    private_ip: pulumi.Output[str]
    login_user: str


@dataclass
class Deployment:
    nodes: list[Node]  # empty in group mode: the group owns its instances
    endpoint: pulumi.Output[str]
    login_user: str
    # group mode: how to enumerate the nodes (cloud, region, tag filter)
    discovery: dict[str, Any] | None = None
    extra_outputs: dict[str, Any] = field(default_factory=dict)
    monitoring: MonitoringHost | None = None
    # tls.backend: the certificate the nodes serve HTTPS with (Prometheus's scrape trusts it)
    node_certificate: pulumi.Output[str] | None = None


NODE_ROLE_TAG = ("torchfleet-role", "gpu-node")
# The monitoring host's role tag: not a GPU node, so EC2 discovery never scrapes it as one.
MONITORING_ROLE_TAG = ("torchfleet-role", "monitoring")


def instances_deployment(cfg: StackConfig, instances: Sequence[Any], login_user: str) -> Deployment:
    """What an instances-mode fleet exports, the same on both clouds: one Node per instance
    (named <stack>-gpu-<i>), the first node's private endpoint, and the SSH tunnel command that
    reaches it from the operator's machine through its public address."""
    first = instances[0]
    port = cfg.service_port
    return Deployment(
        nodes=[
            Node(
                name=f"{cfg.stack}-gpu-{i}",
                instance_type=cfg.instance_type,
                spot=cfg.market == "spot",
                public_ip=inst.public_ip,
                private_ip=inst.private_ip,
            )
            for i, inst in enumerate(instances)
        ],
        endpoint=first.private_ip.apply(lambda ip: f"http://{ip}:{port}"),
        login_user=login_user,
        extra_outputs={
            "ssh_tunnel": pulumi.Output.all(first.public_ip, first.private_ip).apply(
                lambda ips: f"ssh -N -L {port}:{ips[1]}:{port} {login_user}@{ips[0]}"
            )
        },
    )


def discovery_tags(cfg: StackConfig) -> dict[str, str]:
    """The tags every GPU node of the stack carries: what a group's nodes are found by."""
    return {NODE_ROLE_TAG[0]: NODE_ROLE_TAG[1], "stack": cfg.stack}


def group_deployment(
    cfg: StackConfig, address: pulumi.Output[str], login_user: str, **discovery: Any
) -> Deployment:
    """What a group-mode fleet exports, the same on both clouds: no nodes (the group owns its
    instances), the endpoint at the load balancer's `address`, and how an inventory enumerates
    the group's nodes: the cloud and region, then the cloud's own filter and group names
    (`discovery`, built on discovery_tags)."""
    return Deployment(
        nodes=[],
        endpoint=address.apply(lambda a: edge.endpoint(cfg, a)),
        login_user=login_user,
        discovery={"cloud": cfg.cloud, "region": cfg.region, **discovery},
    )
