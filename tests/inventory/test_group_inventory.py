"""Group-mode inventories reach every running node of the group, with the per-host variables an
instances-mode host has.

scripts/inventory_from_stack.py turns a group-mode stack output into stack.yml (the shared facts
and the discovery filter) and group_nodes.py (the inventory script over infra/group_inventory.py),
which real `ansible-inventory --list` runs. AWS: against moto's EC2 (server mode, on loopback)
holding this stack's running nodes, of two instance types, and decoys the filters must drop: a
stopped node, another stack's, an untagged instance. Alibaba: through Alibaba's ECS
SDK, against a fake ECS DescribeInstances on loopback (tests/bootstrap/fake_alibaba.py) that
recomputes the request's signature with the SDK's own signer and checks its tag filters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "bootstrap"))  # the Alibaba fake, importable by name
from fake_alibaba import FakeAlibaba  # noqa: E402

VENV_BIN = Path(sys.executable).parent
TAGS = {"torchfleet-role": "gpu-node", "stack": "aws-prod"}


def outputs(cloud: str, discovery: dict[str, Any]) -> dict[str, Any]:
    """A group-mode stack's outputs as `pulumi stack output --json` gives them (infra.inventory)."""
    return {
        "inventory": {
            "all": {
                "vars": {"torchfleet_discovery": discovery},
                "children": {
                    "gpu_nodes": {
                        "hosts": {},
                        "vars": {
                            "ansible_user": "admin",
                            "torchfleet_cloud": cloud,
                            "torchfleet_env": "prod",
                            "torchfleet_gpu_model": "A10G",
                            "torchfleet_compute_capability": "8.6",
                            "torchfleet_cuda_profile": "cu116",
                            "torchfleet_instance_type": "g5.xlarge",
                            "torchfleet_spot": True,
                        },
                    }
                },
            }
        }
    }


def inventory_dir(tmp: Path, stack: str, outs: dict[str, Any]) -> Path:
    target = tmp / "inventories"
    shutil.copytree(REPO / "inventories" / stack, target / stack)
    (tmp / "outputs.json").write_text(json.dumps(outs))
    made = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "inventory_from_stack.py"),
            stack,
            "--input",
            str(tmp / "outputs.json"),
            "--out-dir",
            str(target),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    return target / stack


def ansible_inventory(path: Path, env: dict[str, str]) -> dict[str, Any]:
    run = subprocess.run(
        [str(VENV_BIN / "ansible-inventory"), "-i", str(path), "--list"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={
            **os.environ,
            "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            **env,
        },
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # Values the plugin composed from the cloud's answers are marked untrusted in the JSON.
    return json.loads(
        run.stdout,
        object_hook=lambda d: d.get("__ansible_unsafe", d) if set(d) == {"__ansible_unsafe"} else d,
    )


@pytest.fixture(scope="module")
def moto_ec2() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_aws_group_inventory_lists_the_running_nodes_of_the_stack(
    moto_ec2: str, tmp_path: Path
) -> None:
    ec2 = boto3.client(
        "ec2",
        endpoint_url=moto_ec2,
        region_name="eu-west-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )

    def launch(tags: dict[str, str], itype: str = "g5.xlarge", spot: bool = False) -> str:
        extra = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
        made = ec2.run_instances(
            ImageId="ami-12c6146b",
            InstanceType=itype,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [
                        {"Key": k, "Value": v}
                        for k, v in {**tags, "Name": "torchfleet-aws-prod-node"}.items()
                    ],
                }
            ],
            **extra,
        )
        return made["Instances"][0]["InstanceId"]

    # a T4 node in an A10G stack: its GPU facts are its own type's, not the stack's
    on_demand, spot = launch(TAGS), launch(TAGS, "g4dn.xlarge", spot=True)
    stopped = launch(TAGS)
    ec2.stop_instances(InstanceIds=[stopped])
    other_stack = launch({**TAGS, "stack": "aws-dev"})
    untagged = launch({})
    path = inventory_dir(
        tmp_path,
        "aws-prod",
        outputs(
            "aws",
            {
                "cloud": "aws",
                "region": "eu-west-1",
                "group_name": "torchfleet-aws-prod-asg",
                "filters": {
                    "tag:torchfleet-role": "gpu-node",
                    "tag:stack": "aws-prod",
                    "instance-state-name": "running",
                },
            },
        ),
    )
    assert os.access(path / "group_nodes.py", os.X_OK)

    inv = ansible_inventory(
        path,
        {
            "AWS_ENDPOINT_URL_EC2": moto_ec2,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "eu-west-1",
        },
    )
    assert sorted(inv["gpu_nodes"]["hosts"]) == sorted([on_demand, spot]), inv["gpu_nodes"]
    for decoy in (stopped, other_stack, untagged):
        assert decoy not in inv["_meta"]["hostvars"]
    described = {
        i["InstanceId"]: i
        for r in ec2.describe_instances(InstanceIds=[on_demand, spot])["Reservations"]
        for i in r["Instances"]
    }
    for host, itype, is_spot, gpu in (
        (on_demand, "g5.xlarge", False, ("A10G", "8.6")),
        (spot, "g4dn.xlarge", True, ("T4", "7.5")),
    ):
        hv = inv["_meta"]["hostvars"][host]
        want_host = described[host].get("PublicIpAddress") or described[host]["PrivateIpAddress"]
        # The instances-mode host's variables, per host ...
        assert (
            hv["ansible_host"] == want_host
            and hv["private_ip"] == described[host]["PrivateIpAddress"]
        )
        assert hv["public_ip"] == described[host].get("PublicIpAddress")
        assert hv["torchfleet_instance_type"] == itype and hv["torchfleet_spot"] is is_spot, hv
        assert (hv["torchfleet_gpu_model"], hv["torchfleet_compute_capability"]) == gpu, hv
        zone = described[host]["Placement"]["AvailabilityZone"].replace("-", "_")
        assert host in inv[f"zone_{zone}"]["hosts"], inv
        # ... and the stack's shared facts from stack.yml's gpu_nodes vars.
        # aws-prod runs Debian 12 (its group_vars log in as admin)
        assert hv["torchfleet_cuda_profile"] == "cu116" and hv["ansible_user"] == "admin", hv


def describe_instances(action: str, params: dict[str, str]) -> dict[str, Any]:
    """ECS DescribeInstances over 102 running nodes, 100 a page (2014-05-26 reply shape)."""
    assert action == "DescribeInstances", action
    page = int(params["PageNumber"])
    instances = [
        {
            "InstanceId": f"i-node{n}",
            "InstanceType": "ecs.gn6i-c4g1.xlarge",
            "PublicIpAddress": {"IpAddress": []},
            "EipAddress": {"IpAddress": "47.0.0.9" if n == 1 else ""},
            "VpcAttributes": {"PrivateIpAddress": {"IpAddress": [f"192.168.0.{n}"]}},
            "SpotStrategy": "SpotWithPriceLimit" if n > 1 else "NoSpot",
        }
        for n in range(1 + 100 * (page - 1), min(101 + 100 * (page - 1), 103))
    ]
    return {"TotalCount": 102, "Instances": {"Instance": instances}}


def test_alicloud_group_inventory_lists_the_running_nodes(tmp_path: Path) -> None:
    with FakeAlibaba(
        describe_instances, access_key="operator", secret="operator-secret", token=None
    ) as ecs:
        path = inventory_dir(
            tmp_path,
            "alicloud-prod",
            outputs(
                "alicloud",
                {
                    "cloud": "alicloud",
                    "region": "cn-shanghai",
                    "scaling_group_name": "torchfleet-alicloud-prod-ess",
                    "tags": {"torchfleet-role": "gpu-node", "stack": "alicloud-prod"},
                },
            ),
        )
        assert os.access(path / "group_nodes.py", os.X_OK)
        inv = ansible_inventory(
            path,
            {
                "ALICLOUD_ACCESS_KEY": "operator",
                "ALICLOUD_SECRET_KEY": "operator-secret",
                "ALICLOUD_ECS_ENDPOINT": ecs.url,
            },
        )
    assert len(inv["gpu_nodes"]["hosts"]) == 102  # both pages
    first, second = inv["_meta"]["hostvars"]["i-node1"], inv["_meta"]["hostvars"]["i-node2"]
    assert first["ansible_host"] == "47.0.0.9" and first["torchfleet_spot"] is False
    assert (
        second["ansible_host"] == second["private_ip"] == "192.168.0.2"
        and second["torchfleet_spot"] is True
    )
    assert first["torchfleet_cuda_profile"] == "cu116"  # the shared facts from stack.yml
    assert first["torchfleet_gpu_model"] == "T4"  # its own type's GPU (ecs.gn6i: T4)
    assert ecs.refused == [] and [c["params"]["PageNumber"] for c in ecs.calls] == ["1", "2"]
    assert all(
        c["version"] == "2014-05-26"
        and p["Status"] == "Running"
        and p["RegionId"] == "cn-shanghai"
        and {p["Tag.1.Key"]: p["Tag.1.Value"], p["Tag.2.Key"]: p["Tag.2.Value"]}
        == {"stack": "alicloud-prod", "torchfleet-role": "gpu-node"}
        for c in ecs.calls
        for p in [c["params"]]
    ), ecs.calls
