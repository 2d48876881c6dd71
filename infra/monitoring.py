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
- The journal travels over HTTPS (roles/monitoring's monitoring_logs_tls_*): `journal_tls` makes
  the stack's journal CA, the receiver's certificate for the host's fixed address and name and
  one client certificate for the stack's nodes; each end's certificate, key and the CA travel in
  its own cloud secret (`journal_secret_name(cfg, end)`, `pem_document(..., with_ca=True)`),
  which only that end's role may read: the nodes with the agent's `journal-tls`, the monitoring
  host with the role's reader, never through the operator's controller.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from infra import edge, images
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


# The journal's TLS: a CA that signs only these two certificates, both kept in the state. The
# receiver's certificate is what every upload verifies; a `pulumi up` in its last
# edge.CERT_RENEWAL_HOURS makes a new one under the same CA, which the monitoring host takes
# within a day (roles/monitoring's daily re-read; the nodes keep trusting the CA).
JOURNAL_CA_VALIDITY_HOURS = 10 * 365 * 24
JOURNAL_CERT_VALIDITY_HOURS = 2 * 365 * 24
CLIENT_USES = ["digital_signature", "key_encipherment", "client_auth"]
JOURNAL_ENDS = ("receiver", "node")


@dataclass(frozen=True)
class JournalTls:
    """The journal's two ends: the receiver's server certificate and the nodes' client
    certificate, each with its key and the journal CA."""

    receiver: edge.Generated
    node: edge.Generated


def journal_tls(name: str, cfg: StackConfig, opts: pulumi.ResourceOptions) -> JournalTls:
    """The stack's journal CA and both ends' certificates (pulumi_tls, in the state)."""
    subject = f"torchfleet {cfg.stack} journal"
    ca = edge.make_ca(
        f"{name}-journal", f"{subject} CA", opts, validity_hours=JOURNAL_CA_VALIDITY_HOURS
    )
    receiver = edge.sign(
        f"{name}-journal-receiver",
        ca,
        f"{subject} receiver",
        edge.SERVER_USES,
        opts,
        validity_hours=JOURNAL_CERT_VALIDITY_HOURS,
        dns_names=[host_name(cfg)],
        ip_addresses=[address(cfg)],
    )
    node = edge.sign(
        f"{name}-journal-node",
        ca,
        f"{subject} nodes",
        CLIENT_USES,
        opts,
        validity_hours=JOURNAL_CERT_VALIDITY_HOURS,
    )
    return JournalTls(receiver=receiver, node=node)


def journal_secret_name(cfg: StackConfig, end: str) -> str:
    """The cloud secret of one end's journal certificate, key and CA (fixed like
    edge.secret_name, so the inventory and the bundle can name it before it exists)."""
    assert end in JOURNAL_ENDS, end
    return (
        f"torchfleet/{cfg.stack}/journal-{end}"
        if cfg.cloud == "aws"
        else f"{cfg.name}-journal-{end}"
    )
