"""The monitoring host on Alibaba Cloud (infra.monitoring): a pay-as-you-go Debian 12 ECS
instance in the private services vSwitch at the plan's fixed address, no public address
(egress through the services NAT gateway), hardened metadata (tokens required), an encrypted
ESSD. No RAM role: Prometheus has no Alibaba discovery, so the role lists the nodes from the
inventory (file_sd) and calls no cloud API. The role (playbooks/monitoring.yml) configures it
from an operator's controller that reaches the VPC (a VPN or bastion inside `admin_cidrs`)."""

from __future__ import annotations

import pulumi
import pulumi_alicloud as alicloud

from infra import healing, monitoring
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
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:alicloud:Monitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        assert cfg.monitoring and network.monitoring_sg and network.services_switch
        host = monitoring.host_name(cfg)
        host_tags = {**tags, MONITORING_ROLE_TAG[0]: MONITORING_ROLE_TAG[1]}
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
            tags=host_tags,
            volume_tags=host_tags,
            opts=child,
        )
        self.host = MonitoringHost(
            name=host, private_ip=instance.private_ip, login_user=monitoring.login_user(cfg)
        )
        self.register_outputs({"private_ip": instance.private_ip})
