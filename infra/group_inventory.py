"""The dynamic inventory of a group-mode stack, on either cloud: the group's running nodes.

A scaling group owns its nodes, so the stack's `inventory` output names a filter instead of
hosts (`all.vars.torchfleet_discovery`, docs/contracts/inventory.md). `torchfleet up` (and
scripts/inventory_from_stack.py) writes stack.yml with it and, beside it, the launcher
`group_nodes.py` (infra.deploy.inventory), which Ansible runs as an inventory script; it calls
`main` here. Each running node goes to `gpu_nodes` (and `zone_<zone>`) with the host variables
of `torchfleet_compat.hostvars.node_hostvars`, the one producer every other path calls too, its
GPU facts looked up by its own instance type (a group may mix types).

- AWS: EC2 DescribeInstances with the discovery's filters through boto3 (its usual credential
  chain; `AWS_ENDPOINT_URL_EC2` points it elsewhere, as boto3 itself reads it).
- Alibaba Cloud: ECS DescribeInstances by the discovery's tags through Alibaba's SDK
  (alibabacloud-ecs20140526), with ALICLOUD_ACCESS_KEY / ALICLOUD_SECRET_KEY (and
  ALICLOUD_SECURITY_TOKEN for STS), as for `pulumi up`; ALICLOUD_ECS_ENDPOINT (a URL) overrides
  the region's endpoint.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from torchfleet_compat.hostvars import GROUP, node_hostvars

from infra.ecs_listing import endpoint_config, running
from infra.inventory import gpu_types

USAGE = "usage: group_nodes.py --list | --host NAME"


@dataclass(frozen=True)
class Instance:
    """What a cloud's listing says of one running node."""

    id: str
    type: str
    spot: bool
    private_ip: str | None
    public_ip: str | None
    zone: str


def discovery(inventory_dir: Path) -> dict[str, Any] | None:
    """The discovery filter of stack.yml in the inventory directory (None: no group stack)."""
    stack = inventory_dir / "stack.yml"
    if not stack.exists():
        return None
    doc = yaml.safe_load(stack.read_text()) or {}
    return ((doc.get("all") or {}).get("vars") or {}).get("torchfleet_discovery") or None


def aws_instances(found: dict[str, Any]) -> Iterator[Instance]:
    import boto3

    ec2 = boto3.client("ec2", region_name=found["region"])
    filters = [
        {"Name": name, "Values": [value] if isinstance(value, str) else list(value)}
        for name, value in sorted(found["filters"].items())
    ]
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            for i in reservation["Instances"]:
                yield Instance(
                    id=i["InstanceId"],
                    type=i["InstanceType"],
                    spot=i.get("InstanceLifecycle") == "spot",
                    private_ip=i.get("PrivateIpAddress"),
                    public_ip=i.get("PublicIpAddress"),
                    zone=i.get("Placement", {}).get("AvailabilityZone", ""),
                )


def alicloud_instances(found: dict[str, Any]) -> Iterator[Instance]:
    from alibabacloud_ecs20140526.client import Client as EcsClient
    from alibabacloud_tea_openapi.models import Config

    try:
        config = Config(
            access_key_id=os.environ["ALICLOUD_ACCESS_KEY"],
            access_key_secret=os.environ["ALICLOUD_SECRET_KEY"],
            security_token=os.environ.get("ALICLOUD_SECURITY_TOKEN") or None,
            region_id=found["region"],
        )
    except KeyError as err:
        raise SystemExit(
            f"group_nodes: set {err.args[0]} (and ALICLOUD_SECRET_KEY) to list the nodes"
        ) from None
    ecs = EcsClient(endpoint_config(config, os.environ.get("ALICLOUD_ECS_ENDPOINT")))
    for i in running(ecs, found["region"], found["tags"]):
        yield Instance(**i)


LISTERS = {"aws": aws_instances, "alicloud": alicloud_instances}


def inventory(found: dict[str, Any], instances: Iterator[Instance]) -> dict[str, Any]:
    """Ansible's --list answer for the group's running nodes."""
    types = gpu_types(found["cloud"])
    hostvars: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[str]] = {GROUP: []}
    for node in instances:
        hostvars[node.id] = node_hostvars(
            node.type, node.spot, types, private_ip=node.private_ip, public_ip=node.public_ip
        )
        groups[GROUP].append(node.id)
        if node.zone:
            groups.setdefault("zone_" + re.sub(r"\W", "_", node.zone), []).append(node.id)
    out: dict[str, Any] = {name: {"hosts": sorted(hosts)} for name, hosts in groups.items()}
    out["_meta"] = {"hostvars": hostvars}
    return out


def main(launcher: str, argv: list[str]) -> int:
    """The inventory-script protocol for the stack whose directory holds `launcher`."""
    if argv[1:2] == ["--host"]:
        print("{}")  # every host's variables come with --list (_meta)
        return 0
    if argv[1:] != ["--list"]:
        print(USAGE, file=sys.stderr)
        return 2
    found = discovery(Path(launcher).absolute().parent)
    if found is None or found.get("cloud") not in LISTERS:
        print(json.dumps({"_meta": {"hostvars": {}}}))  # as hosts.yml alone gives
        return 0
    print(json.dumps(inventory(found, LISTERS[found["cloud"]](found)), indent=2, sort_keys=True))
    return 0
