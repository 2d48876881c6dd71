"""The stack's optional monitoring host (`monitoring.enabled`), what both clouds build for it.

Contract (roles/monitoring/README.md, "What infra must provide"):
- One Debian 12 host (the role's Alertmanager needs Debian 12) in the VPC's services subnet
  (infra.addressing: private, its address fixed by the plan), no public address, egress
  through a NAT gateway (packages; on AWS the EC2 API its discovery calls), an encrypted disk,
  metadata tokens required.
- Its security group admits the journal receiver's port from the GPU nodes' group and SSH from
  `admin_cidrs`, nothing else. The GPU nodes' group admits the scrape ports (`scrape_ports`)
  from the monitoring group (and the service port from the load balancer, as without it).
- AWS: an instance profile with exactly `DISCOVERY_ACTIONS` for Prometheus' EC2 discovery and
  `SPEND_ACTIONS["aws"]` for the spend exporter. Alibaba: a RAM role (`ram_role_name`) with
  exactly `SPEND_ACTIONS["alicloud"]` and, on a group stack, `ECS_DISCOVERY_ACTIONS` (the role's
  ECS discovery timer lists the scaling group's nodes: infra/ecs_listing.py).
- Ports are the roles' own settings as the stack's nodes get them (infra.lifecycle
  .node_setting), never restated here.
"""

from __future__ import annotations

from infra import images
from infra.addressing import monitoring_address
from infra.config import StackConfig
from infra.lifecycle import node_setting

DISTRO = "debian-12"
# Prometheus' ec2_sd_configs call these two; neither has resource-level permissions (the
# Service Authorization Reference lists no resource type for them), so their resource is "*".
DISCOVERY_ACTIONS = ("ec2:DescribeAvailabilityZones", "ec2:DescribeInstances")
# The monitoring role's ECS discovery on an Alibaba group stack (Prometheus has none): the same
# region-wide read, which RAM scopes to no resource either; the host keeps the stack's tags.
ECS_DISCOVERY_ACTIONS = ("ecs:DescribeInstances",)
# The spend exporter's read of the bill (infra.billing, roles/monitoring tasks/spend.yml). Neither
# cloud scopes it to a resource or a tag: the host can read the account's whole bill, and sums
# the stack's lines itself.
SPEND_ACTIONS = {"aws": ("ce:GetCostAndUsage",), "alicloud": ("bssapi:DescribeInstanceBill",)}


def ram_role_name(cfg: StackConfig) -> str:
    """Alibaba: the monitoring host's RAM role (the role's monitoring_spend_ram_role default)."""
    return f"{cfg.name}-monitoring"


def host_name(cfg: StackConfig) -> str:
    return f"{cfg.stack}-monitoring"


def address(cfg: StackConfig) -> str:
    return monitoring_address(cfg.vpc_cidr)


def login_user(cfg: StackConfig) -> str:
    return images.query(cfg.cloud, DISTRO).login_user


def scrape_ports(cfg: StackConfig) -> dict[str, int]:
    """What the monitoring host scrapes on every node, by job."""
    return {
        "runtime": cfg.service_port,
        "node-exporter": int(node_setting(cfg.stack, "monitoring_node_exporter_port")),
    }


def journal_port(cfg: StackConfig) -> int:
    """systemd-journal-remote on the monitoring host; every node uploads to it."""
    return int(node_setting(cfg.stack, "monitoring_logs_port"))
