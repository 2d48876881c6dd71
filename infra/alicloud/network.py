"""VPC, one vSwitch per zone and the security group: SSH only from the admin CIDRs, the service
port only from the VPC (and, in group mode, the CLB's health-check range), egress open.
Routing: the VPC's system route table; nodes reach the internet through their own public
address (cheaper than a NAT gateway, and inbound stays closed)."""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_alicloud as alicloud

from infra.addressing import zone_subnets
from infra.config import StackConfig

SSH_PORT = 22
# CLB health checks and forwarded traffic come from this range, not from the VPC CIDR.
CLB_SOURCE_RANGE = "100.64.0.0/10"


class AlicloudNetwork(pulumi.ComponentResource):
    def __init__(self, name: str, cfg: StackConfig, tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("torchfleet:alicloud:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.vpc = alicloud.vpc.Network(
            f"{name}-vpc", vpc_name=f"{cfg.name}-vpc", cidr_block=cfg.vpc_cidr,
            description=f"torchfleet {cfg.stack}", tags=tags, opts=child)
        self.switches: list[alicloud.vpc.Switch] = []
        for zone, cidr in zip(cfg.zones, zone_subnets(cfg.vpc_cidr, len(cfg.zones)), strict=True):
            self.switches.append(alicloud.vpc.Switch(
                f"{name}-{zone}", vpc_id=self.vpc.id, cidr_block=cidr, zone_id=zone,
                vswitch_name=f"{cfg.name}-{zone}", tags=tags, opts=child))

        self.sg = alicloud.ecs.SecurityGroup(
            f"{name}-nodes", vpc_id=self.vpc.id, security_group_name=f"{cfg.name}-nodes",
            description=f"torchfleet {cfg.stack}: GPU nodes", tags=tags, opts=child)

        def rule(suffix: str, kind: str, protocol: str, ports: str, cidr: str, why: str) -> None:
            v6 = ipaddress.ip_network(cidr).version == 6
            alicloud.ecs.SecurityGroupRule(
                f"{name}-{suffix}", security_group_id=self.sg.id, type=kind,
                ip_protocol=protocol, port_range=ports, policy="accept", priority=1,
                nic_type="intranet", description=why,
                cidr_ip=None if v6 else cidr, ipv6_cidr_ip=cidr if v6 else None, opts=child)

        for i, cidr in enumerate(cfg.admin_cidrs):
            rule(f"ssh-{i}", "ingress", "tcp", f"{SSH_PORT}/{SSH_PORT}", cidr,
                 "SSH from admin networks")
        port = f"{cfg.service_port}/{cfg.service_port}"
        rule("service-vpc", "ingress", "tcp", port, cfg.vpc_cidr, "service port from the VPC")
        if cfg.mode == "group":
            rule("service-clb", "ingress", "tcp", port, CLB_SOURCE_RANGE,
                 "service port from the load balancer")
        rule("egress", "egress", "all", "-1/-1", "0.0.0.0/0", "packages, wheels, models")
        self.register_outputs({"vpc_id": self.vpc.id,
                               "vswitch_ids": [s.id for s in self.switches]})
