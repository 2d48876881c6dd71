#!/usr/bin/env python3
"""Dynamic inventory of an Alibaba Cloud group-mode stack: the running ECS instances its ESS
group owns, found by the tags of the stack's `discovery` output (stack.yml next to this file,
written by scripts/inventory_from_stack.py). The `ansible` package ships no Alibaba inventory
plugin, so Ansible runs this script (`ansible-playbook -i inventories/alicloud-prod ...`).

Hosts go to gpu_nodes with the per-host variables an instances-mode host has: ansible_host
(public or EIP address, else private), public_ip, private_ip, torchfleet_instance_type,
torchfleet_spot; the shared ones come from stack.yml's gpu_nodes vars.

Credentials: ALICLOUD_ACCESS_KEY, ALICLOUD_SECRET_KEY (and ALICLOUD_SECURITY_TOKEN for STS), as
for `pulumi up`. ALICLOUD_ECS_ENDPOINT (a URL) overrides the region's ECS endpoint. ECS is called
through Alibaba's SDK (alibabacloud-ecs20140526, requirements/ansible.txt).
    ecs_inventory.py --list | --host NAME"""

import json
import os
import sys
import urllib.parse
from pathlib import Path

import yaml
from alibabacloud_ecs20140526 import models as ecs_models
from alibabacloud_ecs20140526.client import Client as EcsClient
from alibabacloud_tea_openapi.models import Config

HERE = Path(__file__).absolute().parent  # the inventory directory it runs from (stack.yml)
GROUP = "gpu_nodes"
PAGE = 100


def discovery() -> dict | None:
    stack = HERE / "stack.yml"
    if not stack.exists():
        return None
    found = ((yaml.safe_load(stack.read_text()) or {}).get("all", {}).get("vars") or {}).get(
        "torchfleet_discovery"
    )
    return found if found and found.get("cloud") == "alicloud" else None


def hostvars(instance: dict) -> dict:
    public = (
        (instance.get("PublicIpAddress", {}).get("IpAddress") or [None])[0]
        or instance.get("EipAddress", {}).get("IpAddress")
        or None
    )
    private = (
        instance.get("VpcAttributes", {}).get("PrivateIpAddress", {}).get("IpAddress") or [None]
    )[0]
    return {
        "ansible_host": public or private,
        "public_ip": public,
        "private_ip": private,
        "torchfleet_instance_type": instance.get("InstanceType"),
        "torchfleet_spot": instance.get("SpotStrategy", "NoSpot") not in ("NoSpot", ""),
    }


def running_nodes(found: dict) -> dict:
    try:
        config = Config(
            access_key_id=os.environ["ALICLOUD_ACCESS_KEY"],
            access_key_secret=os.environ["ALICLOUD_SECRET_KEY"],
            security_token=os.environ.get("ALICLOUD_SECURITY_TOKEN") or None,
            region_id=found["region"],
        )
    except KeyError as err:
        raise SystemExit(
            f"ecs_inventory: set {err.args[0]} (and ALICLOUD_SECRET_KEY) to list the nodes"
        ) from None
    if os.environ.get("ALICLOUD_ECS_ENDPOINT"):
        url = urllib.parse.urlsplit(os.environ["ALICLOUD_ECS_ENDPOINT"])
        config.endpoint, config.protocol = url.netloc, url.scheme
    ecs = EcsClient(config)
    tags = [
        ecs_models.DescribeInstancesRequestTag(key=key, value=value)
        for key, value in sorted(found["tags"].items())
    ]
    hosts, page = {}, 1
    while True:
        reply = ecs.describe_instances(
            ecs_models.DescribeInstancesRequest(
                region_id=found["region"],
                status="Running",
                page_size=PAGE,
                page_number=page,
                tag=tags,
            )
        ).body.to_map()
        for instance in reply.get("Instances", {}).get("Instance", []):
            hosts[instance["InstanceId"]] = hostvars(instance)
        if page * PAGE >= int(reply.get("TotalCount", 0)):
            return hosts
        page += 1


def main(argv: list) -> int:
    if argv[1:2] == ["--host"]:
        print("{}")
        return 0
    if argv[1:] != ["--list"]:
        print(__doc__, file=sys.stderr)
        return 2
    found = discovery()
    if found is None:  # no stack.yml yet: an empty inventory, as hosts.yml alone gives
        print(json.dumps({"_meta": {"hostvars": {}}}))
        return 0
    hosts = running_nodes(found)
    print(
        json.dumps(
            {GROUP: {"hosts": sorted(hosts)}, "_meta": {"hostvars": hosts}},
            indent=2,
            sort_keys=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
