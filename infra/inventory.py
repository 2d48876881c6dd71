"""The `inventory` stack output: an Ansible YAML inventory (the shape inventories/*/hosts.yml
takes), with the per-host variables the roles read."""

from __future__ import annotations

from typing import Any

import pulumi

from infra.config import StackConfig
from infra.interface import Deployment

GROUP = "gpu_nodes"


def group_vars(cfg: StackConfig, login_user: str) -> dict[str, Any]:
    itype = cfg.instance_type
    return {
        "ansible_user": login_user,
        "torchfleet_cloud": cfg.cloud,
        "torchfleet_env": cfg.env,
        "torchfleet_gpu_model": itype.gpu_model,
        "torchfleet_compute_capability": itype.compute_capability,
        "torchfleet_cuda_profile": cfg.cuda_profile,
        "torchfleet_instance_type": itype.name,
        # In a group some nodes may be on-demand (the base); the node's own metadata decides,
        # the runtime's spot watcher only arms itself on spot nodes.
        "torchfleet_spot": cfg.spot.enabled,
    }


def build(cfg: StackConfig, deployment: Deployment) -> pulumi.Output[dict[str, Any]]:
    shared = group_vars(cfg, deployment.login_user)
    if not deployment.nodes:
        return pulumi.Output.from_input({"all": {
            "vars": {"torchfleet_discovery": deployment.discovery},
            "children": {GROUP: {"hosts": {}, "vars": shared}}}})

    def host(node, public_ip: str | None, private_ip: str) -> dict[str, Any]:
        return {**shared,
                "ansible_host": public_ip or private_ip,
                "public_ip": public_ip,
                "private_ip": private_ip,
                "torchfleet_instance_type": node.instance_type.name,
                "torchfleet_spot": node.spot}

    addresses = [pulumi.Output.all(n.public_ip, n.private_ip) for n in deployment.nodes]

    def assemble(ips: list[list[str]]) -> dict[str, Any]:
        hosts = {n.name: host(n, pub, priv) for n, (pub, priv) in zip(deployment.nodes, ips,
                                                                      strict=True)}
        return {"all": {"children": {GROUP: {"hosts": hosts}}}}

    return pulumi.Output.all(*addresses).apply(assemble)
