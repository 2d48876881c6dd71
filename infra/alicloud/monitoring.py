"""The monitoring host on Alibaba Cloud (infra.monitoring): a pay-as-you-go Debian 12 ECS
instance in the private services vSwitch at the plan's fixed address, no public address
(egress through the services NAT gateway), hardened metadata (tokens required), an encrypted
ESSD. Prometheus has no Alibaba discovery, so the role lists the nodes as file_sd: from the
inventory, or on a group stack (whose nodes come and go) by a timer listing the stack's running
ECS instances by tag. The cloud APIs the host calls are BSS's DescribeInstanceBill (the spend
exporter) and, on a group stack, ECS DescribeInstances, through a RAM role that may call exactly
those, and read the journal receiver's certificate secret (alicloud/edge.py's journal_store).
The role (playbooks/monitoring.yml) configures it from an operator's controller that reaches the
VPC (a VPN or bastion inside `admin_cidrs`)."""

from __future__ import annotations

import json

import pulumi
import pulumi_alicloud as alicloud

from infra import healing, monitoring
from infra.alicloud import edge as ali_edge
from infra.alicloud.fleet import attach_policy, role_policy
from infra.alicloud.network import AlicloudNetwork
from infra.config import StackConfig
from infra.interface import MONITORING_ROLE_TAG, MonitoringHost


class AlicloudMonitoring(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        network: AlicloudNetwork,
        key: alicloud.ecs.EcsKeyPair,
        image_id: pulumi.Input[str],
        journal: monitoring.JournalTls,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:alicloud:Monitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        assert cfg.monitoring and network.monitoring_sg and network.services_switch
        host = monitoring.host_name(cfg)
        host_tags = {**tags, MONITORING_ROLE_TAG[0]: MONITORING_ROLE_TAG[1]}
        role = alicloud.ram.Role(
            f"{name}-role",
            role_name=monitoring.ram_role_name(cfg),
            assume_role_policy_document=role_policy("ecs.aliyuncs.com"),
            description=f"torchfleet {cfg.stack} monitoring host (spend)",
            force=True,
            tags=tags,
            opts=child,
        )
        # BSS scopes no action to a resource or tag: the host reads the account's instance bill
        # and keeps the stack's lines itself (infra.billing). A group stack's nodes come and go:
        # the role's ECS discovery lists them by the stack's tags (region-wide, like the bill).
        actions = list(monitoring.SPEND_ACTIONS["alicloud"])
        if cfg.mode == "group":
            actions += monitoring.ECS_DISCOVERY_ACTIONS

        def grant(suffix: str, description: str, document: str) -> None:
            """One custom policy of the host's role (fleet.attach_policy)."""
            attach_policy(
                f"{name}-{suffix}",
                f"{cfg.name}-monitoring-{suffix}",
                description,
                document,
                role.role_name,
                tags,
                child,
            )

        grant(
            "spend",
            "read the instance bill (the spend exporter)"
            + ("; list the group's nodes (ECS discovery)" if cfg.mode == "group" else ""),
            json.dumps(
                {
                    "Version": "1",
                    "Statement": [{"Effect": "Allow", "Action": actions, "Resource": ["*"]}],
                }
            ),
        )
        # the journal receiver's certificate, key and CA (roles/monitoring reads them on the host)
        ali_edge.journal_store(name, cfg, "receiver", journal.receiver, tags, child)
        grant(
            "journal",
            "read the journal receiver's certificate",
            ali_edge.secret_read_policy(cfg, monitoring.journal_secret_name(cfg, "receiver")),
        )
        instance = alicloud.ecs.Instance(
            f"{name}-host",
            instance_name=host,
            host_name=host,
            availability_zone=cfg.zones[0],
            vswitch_id=network.services_switch.id,
            private_ip=monitoring.address(cfg),
            security_groups=[network.monitoring_sg.id],
            instance_type=cfg.monitoring.instance_type.name,
            image_id=image_id,
            key_name=key.key_pair_name,
            instance_charge_type="PostPaid",
            spot_strategy="NoSpot",
            maintenance_action=healing.AUTO_RECOVER,  # infra.healing
            internet_max_bandwidth_out=0,  # no public address
            system_disk_category="cloud_essd",
            system_disk_size=cfg.monitoring.disk_gb,
            system_disk_encrypted=True,
            http_endpoint="enabled",
            http_tokens="required",
            role_name=role.role_name,
            tags=host_tags,
            volume_tags=host_tags,
            opts=child,
        )
        self.host = MonitoringHost(
            name=host, private_ip=instance.private_ip, login_user=monitoring.login_user(cfg)
        )
        self.register_outputs({"private_ip": instance.private_ip})
