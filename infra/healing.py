"""Which self-healing each node gets: the strongest its cloud, instance type and purchase option
allow. The fleets register what this module decides; the plan prints it per node.

Contract: `for_instance(cloud, itype, spot)` -> `Healing` for one instance the stack runs by
itself (instances mode, the monitoring host); `for_group(cloud)` for a node a scaling group
owns.
- AWS: the CloudWatch alarm action `recover` (on a failed SYSTEM status check: the instance
  moves to healthy hardware, keeping its id, addresses and EBS volumes) where AWS supports it:
  not for spot instances and not for types with instance store volumes (g4dn, g5, g6, p4d, p5:
  compat/catalog.yml's `instance_store`). Every instance also gets `reboot` on a failed INSTANCE
  status check (the guest hung: kernel panic, exhausted memory), which AWS allows for every
  type and purchase option, spot included.
- Alibaba: the instance's maintenance action `AutoRecover` (on a host failure ECS restarts it on
  a healthy host). A hung guest has no declarative equivalent of the reboot alarm: a
  CloudMonitor alarm cannot reboot an ECS instance.
- A group's node is replaced by its group when the load balancer's health check fails
  (Auto Scaling health check type ELB; ESS health check LOAD_BALANCER): stronger than either.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalog import HostType, InstanceType

RECOVER, REBOOT, AUTO_RECOVER, REPLACE = "recover", "reboot", "AutoRecover", "replace"
# CloudWatch: a status check is evaluated each minute; this many failed minutes in a row act.
RECOVER_MINUTES = 2
REBOOT_MINUTES = 3


@dataclass(frozen=True)
class Healing:
    actions: tuple[str, ...]  # strongest first
    why: str  # one sentence for the plan: what happens, and what is missing and why

    def describe(self) -> str:
        return f"{' + '.join(self.actions)}: {self.why}"


def for_instance(cloud: str, itype: InstanceType | HostType, spot: bool) -> Healing:
    if cloud == "alicloud":
        return Healing(
            (AUTO_RECOVER,),
            "ECS restarts it on a healthy host after a host failure (maintenance action); a "
            "hung guest is not rebooted (no CloudMonitor alarm action reboots an instance)",
        )
    reboot = f"reboot after {REBOOT_MINUTES} min of failed instance status checks"
    if spot:
        return Healing((REBOOT,), f"{reboot}; no recover action: AWS does not recover spot")
    if itype.instance_store:
        return Healing(
            (REBOOT,),
            f"{reboot}; no recover action: {itype.name} has instance store volumes",
        )
    return Healing(
        (RECOVER, REBOOT),
        f"recover onto healthy hardware after {RECOVER_MINUTES} min of failed system status "
        f"checks; {reboot}",
    )


def for_group(cloud: str) -> Healing:
    check = "the ALB's" if cloud == "aws" else "the CLB's"
    return Healing((REPLACE,), f"the group replaces a node that fails {check} /readyz check")
