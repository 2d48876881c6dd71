#!/usr/bin/env python3
"""Dynamic inventory of an Alibaba Cloud group-mode stack: the running ECS instances its ESS
group owns, found by the tags of the stack's `discovery` output (stack.yml next to this file,
written by scripts/inventory_from_stack.py). The `ansible` package ships no Alibaba inventory
plugin, so Ansible runs this script (`ansible-playbook -i inventories/alicloud-prod ...`).

Hosts go to gpu_nodes with the per-host variables an instances-mode host has: ansible_host
(public or EIP address, else private), public_ip, private_ip, torchfleet_instance_type,
torchfleet_spot; the shared ones come from stack.yml's gpu_nodes vars.

Credentials: ALICLOUD_ACCESS_KEY, ALICLOUD_SECRET_KEY (and ALICLOUD_SECURITY_TOKEN for STS), as
for `pulumi up`. ALICLOUD_ECS_ENDPOINT overrides https://ecs.<region>.aliyuncs.com. Requests
are signed by the node agent's signer (infra/bootstrap/agent.py, RPC signature v1).
    ecs_inventory.py --list | --host NAME"""

import json
import os
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).absolute().parent  # the inventory directory it runs from (stack.yml)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository (infra/)

from infra.bootstrap.agent import rpc_call  # noqa: E402

GROUP = "gpu_nodes"


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
        creds = {
            "AccessKeyId": os.environ["ALICLOUD_ACCESS_KEY"],
            "AccessKeySecret": os.environ["ALICLOUD_SECRET_KEY"],
            "SecurityToken": os.environ.get("ALICLOUD_SECURITY_TOKEN", ""),
        }
    except KeyError as err:
        raise SystemExit(
            f"ecs_inventory: set {err.args[0]} (and ALICLOUD_SECRET_KEY) to list the nodes"
        ) from None
    region = found["region"]
    endpoint = os.environ.get("ALICLOUD_ECS_ENDPOINT", f"https://ecs.{region}.aliyuncs.com")
    tags = {}
    for i, (key, value) in enumerate(sorted(found["tags"].items()), 1):
        tags.update({f"Tag.{i}.Key": key, f"Tag.{i}.Value": value})
    hosts, page = {}, 1
    while True:
        reply = rpc_call(
            endpoint,
            "2014-05-26",
            "DescribeInstances",
            creds,
            region,
            Status="Running",
            PageSize="100",
            PageNumber=str(page),
            **tags,
        )
        for instance in reply.get("Instances", {}).get("Instance", []):
            hosts[instance["InstanceId"]] = hostvars(instance)
        if page * 100 >= int(reply.get("TotalCount", 0)):
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
