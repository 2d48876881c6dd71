"""The `inventory` stack output: an Ansible YAML inventory (the shape inventories/*/hosts.yml
takes), with the per-host variables the roles read.

Groups: `gpu_nodes` (instances mode: every node with its addresses; group mode: none, the
discovery filter finds them) and, with `monitoring.enabled`, `monitoring` (the one monitoring
host on its private address, with the ports its scrape configuration needs).

`group_vars(cfg)` is also what the node bundle's node.json carries (infra.bundle), so a node
that configures itself gets the same facts an operator's run does; it holds config facts only
(no Output), which keeps the bundle a function of the config."""

from __future__ import annotations

from typing import Any

import pulumi
from torchfleet_compat.hostvars import GROUP, node_hostvars

from infra import catalog, edge
from infra.bootstrap import NODE_PATHS

# Where a node keeps the stack's node certificate and key (tls.backend): in the runtime's
# configuration directory (0750 root:torchfleet); the agent asks its runtime over HTTPS there.
from infra.bootstrap.torchfleet_agent.local import (
    JOURNAL_TLS_CA,
    JOURNAL_TLS_CERT,
    JOURNAL_TLS_KEY,
    NODE_TLS_CERT,
    NODE_TLS_KEY,
)
from infra.config import StackConfig
from infra.interface import Deployment, Node
from infra.monitoring import address as monitoring_address
from infra.monitoring import journal_secret_name

# Both ends of the journal's HTTPS keep their certificate, key and the journal CA here
# (roles/monitoring's monitoring_logs_tls_*_file), each end's from its own secret.
JOURNAL_TLS_FILES = {
    "monitoring_logs_tls_cert_file": JOURNAL_TLS_CERT,
    "monitoring_logs_tls_key_file": JOURNAL_TLS_KEY,
    "monitoring_logs_tls_ca_file": JOURNAL_TLS_CA,
}

__all__ = ["GROUP", "MONITORING_GROUP", "build", "gpu_types", "group_vars"]

MONITORING_GROUP = "monitoring"


def gpu_types(cloud: str) -> dict[str, dict[str, Any]]:
    """The catalog's instance type -> GPU table a node's host vars are looked up in
    (`torchfleet_compat.hostvars`); the node bundle's node.json carries the same table."""
    return {
        t.name: {
            "gpu_model": t.gpu_model,
            "gpu_count": t.gpu_count,
            "compute_capability": t.compute_capability,
        }
        for t in catalog.instance_types(cloud).values()
    }


def group_vars(cfg: StackConfig, login_user: str) -> dict[str, Any]:
    itype = cfg.instance_type
    shared = {
        "ansible_user": login_user,
        "torchfleet_cloud": cfg.cloud,
        "torchfleet_env": cfg.env,
        "torchfleet_gpu_model": itype.gpu_model,
        "torchfleet_compute_capability": itype.compute_capability,
        "torchfleet_cuda_profile": cfg.cuda_profile,
        "torchfleet_instance_type": itype.name,
        # In a group some nodes may be on-demand (the base); the node's own metadata decides,
        # the runtime's spot watcher only arms itself on spot nodes.
        "torchfleet_spot": cfg.market == "spot",
        # Auth on by default: each node reads the stack's API tokens from the cloud's secret
        # store with its own role (the agent every node carries); the operator's play and the
        # node's own play alike, so neither turns it off. The token never passes the controller.
        "inference_runtime_api_token_command": [NODE_PATHS["command"], "api-token"],
    }
    if edge.backend_tls(cfg):
        # tls.backend: the runtime serves HTTPS with the stack's node certificate, which each
        # node reads from the cloud's secret store with its own role, as it reads the tokens,
        # into the runtime's configuration directory (0750 root:torchfleet), where the agent
        # finds it to ask its runtime over HTTPS (torchfleet_agent/local.py).
        shared["inference_runtime_tls_command"] = [
            NODE_PATHS["command"],
            "node-tls",
            edge.node_tls_secret_name(cfg),
        ]
        shared["inference_runtime_tls_cert_file"] = NODE_TLS_CERT
        shared["inference_runtime_tls_key_file"] = NODE_TLS_KEY
    if cfg.mode == "group":
        # A group replaces a node that powers itself off (a new node, a new bootstrap: cost and
        # churn, no saving): an idle group shrinks by its own scale-in (scaling.scale_in) and
        # its schedule, never by its nodes stopping themselves (roles/autostop).
        shared["autostop_enabled"] = False
    if cfg.monitoring:
        # Where every node ships its journal (roles/monitoring, node entry point). The role's
        # default finds it in the inventory's monitoring group, which a node configuring
        # itself (cloud-init) does not have; the address is fixed by the address plan.
        shared["monitoring_logs_server"] = monitoring_address(cfg)
        # ... over HTTPS: each node reads the nodes' journal certificate, key and the journal
        # CA from the cloud's secret store with its own role (as it reads the tokens).
        shared["monitoring_logs_tls_command"] = [
            NODE_PATHS["command"],
            "journal-tls",
            journal_secret_name(cfg, "node"),
        ]
        shared.update(JOURNAL_TLS_FILES)
    return shared


def _monitoring_group(
    cfg: StackConfig, deployment: Deployment
) -> pulumi.Output[dict[str, Any]] | None:
    host = deployment.monitoring
    if host is None:
        return None

    def group(ip: str, node_certificate: str | None) -> dict[str, Any]:
        hostvars: dict[str, Any] = {
            "ansible_host": ip,
            "private_ip": ip,
            "ansible_user": host.login_user,
            # The runtime's port as this stack sets it (the role's default is 8080).
            "monitoring_runtime_port": cfg.service_port,
            # The journal receiver's certificate, key and CA: the role reads them on the host
            # with the host's own role (never through the controller).
            "monitoring_logs_tls_secret": journal_secret_name(cfg, "receiver"),
            "monitoring_logs_tls_region": cfg.region,  # the secret's (mode instances too)
            **JOURNAL_TLS_FILES,
        }
        if node_certificate:
            # tls.backend: scrape the runtime over HTTPS, trusting the nodes' certificate alone
            hostvars["monitoring_runtime_tls_ca"] = node_certificate
            hostvars["monitoring_runtime_tls_server_name"] = edge.NODE_NAME
        return {"hosts": {host.name: hostvars}}

    return pulumi.Output.all(host.private_ip, deployment.node_certificate).apply(
        lambda v: group(*v)
    )


def build(cfg: StackConfig, deployment: Deployment) -> pulumi.Output[dict[str, Any]]:
    shared = group_vars(cfg, deployment.login_user)
    monitoring = _monitoring_group(cfg, deployment)

    def with_monitoring(inv: dict[str, Any], group: dict[str, Any] | None) -> dict[str, Any]:
        if group is not None:
            inv["all"]["children"][MONITORING_GROUP] = group
        return inv

    if not deployment.nodes:
        inv = {
            "all": {
                "vars": {"torchfleet_discovery": deployment.discovery},
                "children": {GROUP: {"hosts": {}, "vars": shared}},
            }
        }
        return pulumi.Output.all(pulumi.Output.from_input(inv), monitoring).apply(
            lambda v: with_monitoring(*v)
        )

    types = gpu_types(cfg.cloud)

    def host(node: Node, public_ip: str | None, private_ip: str) -> dict[str, Any]:
        own = node_hostvars(
            node.instance_type.name, node.spot, types, private_ip=private_ip, public_ip=public_ip
        )
        return {**shared, **own}

    addresses = [pulumi.Output.all(n.public_ip, n.private_ip) for n in deployment.nodes]

    def assemble(values: list[Any]) -> dict[str, Any]:
        *ips, group = values
        hosts = {
            n.name: host(n, pub, priv) for n, (pub, priv) in zip(deployment.nodes, ips, strict=True)
        }
        return with_monitoring({"all": {"children": {GROUP: {"hosts": hosts}}}}, group)

    return pulumi.Output.all(*addresses, monitoring).apply(assemble)
