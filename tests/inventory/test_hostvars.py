"""One host-vars contract, five writers: the stack outputs (instances mode), the group-mode
dynamic inventory (either cloud), the node agent's local inventory and the demo's container
nodes all describe a node with `torchfleet_compat.hostvars.node_hostvars`. Here one node of the
aws-dev program (under Pulumi's mock engine) is described by every other path from the same
facts, and the variables must agree; a node of another type than the stack's gets its own GPU.
The listers' real cloud calls are tests/inventory/test_group_inventory.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from torchfleet_compat.hostvars import ADDRESS_KEYS, FACT_KEYS, GROUP, node_hostvars

from infra import bundle, group_inventory
from infra.bootstrap.torchfleet_agent import boot
from infra.bootstrap.torchfleet_agent import inventory as agent_inventory
from infra.deploy import demo
from infra.inventory import gpu_types
from infra.offline import run_offline
from infra.plan import load_stack_config

STACK = "aws-dev"
OWN = (*FACT_KEYS, "torchfleet_spot")


@pytest.fixture(scope="module")
def stack_host() -> dict[str, Any]:
    """The first host of aws-dev's `inventory` output (path 1: infra/inventory.py)."""
    outputs = run_offline(STACK, copy.deepcopy(load_stack_config(STACK))).outputs
    hosts = outputs["inventory"]["all"]["children"][GROUP]["hosts"]
    return next(iter(hosts.values()))


def group_path(cloud: str, itype: str, spot: bool, private: str, public: str | None) -> dict:
    """Path 2: the group-mode inventory's answer for one listed instance."""
    node = group_inventory.Instance("i-0abc", itype, spot, private, public, "eu-west-1a")
    listed = group_inventory.inventory({"cloud": cloud}, iter([node]))
    assert listed[GROUP]["hosts"] == ["i-0abc"] and listed["zone_eu_west_1a"]["hosts"]
    return listed["_meta"]["hostvars"]["i-0abc"]


def agent_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, itype: str, spot: bool) -> dict:
    """Path 3: the node agent's inventory of its own node, from the stack's real node.json."""
    monkeypatch.setattr(boot, "WORK", str(tmp_path / "work"))
    tree = tmp_path / "bundle"
    (tree / "inventories" / STACK / "group_vars").mkdir(parents=True)
    (tree / "node.json").write_text(json.dumps(bundle.stack_facts(STACK)))
    manifest = {"stack": STACK, "runtime_wheel": "w.whl", "compat_wheel": "c.whl"}
    (tree / "manifest.json").write_text(json.dumps(manifest))
    ident = {"instance_id": "i-0abc", "instance_type": itype, "spot": spot}
    hosts_file = agent_inventory.write_inventory({"service_port": 8080}, ident, str(tree))
    inv = json.loads(Path(hosts_file).read_text())
    return inv["all"]["children"][GROUP]["hosts"]["i-0abc"]


def test_every_path_describes_the_same_node_alike(stack_host, tmp_path, monkeypatch) -> None:
    itype, spot = stack_host["torchfleet_instance_type"], stack_host["torchfleet_spot"]
    private, public = stack_host["private_ip"], stack_host["public_ip"]
    assert stack_host["torchfleet_gpu_model"]  # a catalog type: the check below compares GPUs

    group = group_path("aws", itype, spot, private, public)
    agent = agent_path(tmp_path, monkeypatch, itype, spot)
    for key in OWN:
        assert stack_host[key] == group[key] == agent[key], key
    for key in ADDRESS_KEYS:  # the agent's play is local: it has no addresses
        assert stack_host[key] == group[key], key
        assert key not in agent
    assert agent["ansible_connection"] == "local"

    # Path 4: the demo's container node keeps the stack host's type, its own addresses, no GPU.
    contained = demo.container_host(stack_host, "10.88.0.7", 2222)
    assert contained == {
        **stack_host,
        **node_hostvars(
            itype, False, {}, private_ip="10.88.0.7", public_ip="127.0.0.1", ssh_port=2222
        ),
        "torchfleet_cuda_profile": "cpu",
    }
    assert contained["ansible_host"] == "127.0.0.1" and contained["torchfleet_gpu_model"] == ""


@pytest.mark.parametrize("itype, want", [("g4dn.xlarge", ("T4", "7.5")), ("x9.huge", ("", ""))])
def test_a_node_of_another_type_gets_its_own_gpu(
    stack_host, tmp_path, monkeypatch, itype: str, want: tuple[str, str]
) -> None:
    """The stack is an L4 stack; a T4 node (a group may mix types) is described as a T4 by
    every path, and a type the catalog does not know gets empty GPU facts (preflight detects)."""
    assert stack_host["torchfleet_gpu_model"] != want[0]
    for host in (
        group_path("aws", itype, True, "10.0.1.5", None),
        agent_path(tmp_path, monkeypatch, itype, True),
        node_hostvars(itype, True, gpu_types("aws")),
    ):
        got = (host["torchfleet_gpu_model"], host["torchfleet_compute_capability"])
        assert got == want, host
        assert host["torchfleet_instance_type"] == itype and host["torchfleet_spot"] is True
