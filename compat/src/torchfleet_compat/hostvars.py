"""A GPU node's host variables: the per-host half of the inventory contract, produced once.

Contract (docs/contracts/inventory.md). Every path that tells Ansible about a GPU node calls
`node_hostvars`, so adding a host variable is one edit here:
- the stack outputs in instances mode (infra/inventory.py),
- the group-mode dynamic inventory of both clouds (infra/group_inventory.py),
- the node agent describing its own node to a local play (torchfleet_agent/inventory.py, from
  the node bundle, which ships this package),
- the demo's container nodes (infra/deploy/demo.py).

The GPU facts come from the node's own instance type through `gpu_types` (the catalog's table:
type -> gpu_model, compute_capability), not from the stack's primary type: a group may mix
types (`extra_instance_types`). A type the table does not know gets empty GPU facts, and the
preflight detects the GPU itself. The stack facts every node shares (cloud, env, CUDA profile,
login user) are group variables, not this function's.

Standard library only, Python 3.8+: it runs in the node agent's venv on a bare node.
"""

from __future__ import annotations

from typing import Any, Mapping

# The Ansible group every playbook targets.
GROUP = "gpu_nodes"

# The keys `node_hostvars` always sets.
FACT_KEYS = ("torchfleet_instance_type", "torchfleet_gpu_model", "torchfleet_compute_capability")
# The keys it sets for a node reached over the network (not a local play).
ADDRESS_KEYS = ("ansible_host", "public_ip", "private_ip")


def node_hostvars(
    instance_type: str | None,
    spot: bool | None,
    gpu_types: Mapping[str, Mapping[str, Any]],
    *,
    private_ip: str | None = None,
    public_ip: str | None = None,
    ssh_port: int | None = None,
    local_python: str | None = None,
) -> dict[str, Any]:
    """The host variables of one GPU node.

    `spot`: None when the caller cannot tell (the variable is then left to the group's).
    `local_python`: the node configures itself (a local play with that interpreter) instead of
    being reached at its addresses. `ssh_port`: a port other than 22 (the demo's containers).
    """
    host: dict[str, Any] = {}
    if local_python:
        host["ansible_connection"] = "local"
        host["ansible_python_interpreter"] = local_python
    else:
        host["ansible_host"] = public_ip or private_ip
        host["public_ip"] = public_ip or None
        host["private_ip"] = private_ip
    if ssh_port is not None:
        host["ansible_port"] = ssh_port
    gpu = gpu_types.get(instance_type or "") or {}
    host["torchfleet_instance_type"] = instance_type or ""
    host["torchfleet_gpu_model"] = gpu.get("gpu_model", "")
    host["torchfleet_compute_capability"] = gpu.get("compute_capability", "")
    if spot is not None:
        host["torchfleet_spot"] = bool(spot)
    return host
