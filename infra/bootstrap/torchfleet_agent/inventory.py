"""This node as an Ansible inventory: the operator's shape, written for the local play."""

from __future__ import annotations

import os
from typing import Any

from torchfleet_compat.hostvars import GROUP, node_hostvars

from . import boot
from .boot import NodeConfig
from .cloud import Identity


def write_inventory(cfg: NodeConfig, ident: Identity, tree: str) -> str:
    """gpu_nodes with the stack facts as group vars, this node's facts (from its metadata) as
    host vars, the stack's group_vars/ beside it; node-vars.json with what must win over the
    stack's settings: the bundle's wheel, model downloads through this agent, the port the load
    balancer checks, and the node config's `model` (a rollout's track) when it has one.
    Returns the inventory's path."""
    node = boot.read_json(os.path.join(tree, "node.json"))
    manifest = boot.read_json(os.path.join(tree, "manifest.json"))
    # A type node.json's table does not know gets empty GPU facts: preflight detects the GPU.
    host = node_hostvars(
        ident["instance_type"],
        ident.get("spot"),
        node["instance_types"],
        local_python="/usr/bin/python3",
    )
    inv = os.path.join(boot.WORK, "inventory")
    os.makedirs(inv, exist_ok=True)
    link = os.path.join(inv, "group_vars")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.join(tree, "inventories", manifest["stack"], "group_vars"), link)
    boot.write_json(
        os.path.join(inv, "hosts.json"),
        {
            "all": {
                "children": {
                    GROUP: {"vars": node["group_vars"], "hosts": {ident["instance_id"]: host}}
                }
            }
        },
    )
    fetch = [boot.COMMAND, "fetch"]
    node_vars: dict[str, Any] = {
        "inference_runtime_wheel": os.path.join(tree, manifest["runtime_wheel"]),
        "inference_runtime_compat_wheel": os.path.join(tree, manifest["compat_wheel"]),
        "inference_runtime_s3_command": fetch,
        "inference_runtime_oss_command": fetch,
        "inference_runtime_port": cfg.get("service_port", 8080),
    }
    if cfg.get("group_name"):  # the lifecycle watcher leaves the balancer, then drains
        node_vars["inference_runtime_spot_watch"] = "off"
    model = cfg.get("model")
    if model:  # a rollout's track: its model wins over the bundle's group vars
        node_vars["inference_runtime_model_source"] = model["source"]
        node_vars["inference_runtime_model_checksum"] = model["checksum"]
    boot.write_json(os.path.join(boot.WORK, "node-vars.json"), node_vars)
    return os.path.join(inv, "hosts.json")
