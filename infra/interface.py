"""The one small interface every cloud implements: network, fleet and teardown components
composed by a `deploy` function that returns what the stack exports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi

from infra.catalog import InstanceType


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


NODE_ROLE_TAG = ("torchfleet-role", "gpu-node")
# The monitoring host's role tag: not a GPU node, so EC2 discovery never scrapes it as one.
MONITORING_ROLE_TAG = ("torchfleet-role", "monitoring")
