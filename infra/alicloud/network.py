"""VPC, one vSwitch per zone and the security group: SSH only from the admin CIDRs, the service
port only from the VPC (and, in group mode, the CLB's health-check range), egress open.
Routing: the VPC's system route table; nodes reach the internet through their own public
address (cheaper than a NAT gateway, and inbound stays closed). With `monitoring.enabled` also
the private services vSwitch, whose host reaches the internet through an enhanced NAT gateway
(its SNAT entry covers that vSwitch only; nodes with a public address keep using their own),
and the monitoring host's security group: the GPU nodes admit the scrape ports from it only, it
admits the journal upload from the GPU nodes only and SSH from the admin CIDRs
(infra.monitoring)."""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_alicloud as alicloud

from infra import monitoring
from infra.addressing import services_subnet, zone_subnets
from infra.config import StackConfig

SSH_PORT = 22
# CLB health checks and forwarded traffic come from this range, not from the VPC CIDR.
CLB_SOURCE_RANGE = "100.64.0.0/10"


class AlicloudNetwork(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:alicloud:Network", name, None, opts)
        self.name, self.child = name, pulumi.ResourceOptions(parent=self)
        child = self.child
        self.vpc = alicloud.vpc.Network(
            f"{name}-vpc",
            vpc_name=f"{cfg.name}-vpc",
            cidr_block=cfg.vpc_cidr,
            description=f"torchfleet {cfg.stack}",
            tags=tags,
            opts=child,
        )
        self.switches = self._zone_switches(cfg, tags)
        self.sg = self._security_group("nodes", "GPU nodes", cfg, tags)
        self.monitoring_sg: alicloud.ecs.SecurityGroup | None = None
        self.services_switch: alicloud.vpc.Switch | None = None
        if cfg.monitoring:
            self.services_switch = self._services_switch(name, cfg, tags, child)
            self.monitoring_sg = self._security_group("monitoring", "monitoring host", cfg, tags)
        self._node_rules(cfg)
        if self.monitoring_sg is not None:
            self._monitoring_rules(cfg, self.monitoring_sg)
        self.register_outputs({"vpc_id": self.vpc.id, "vswitch_ids": [s.id for s in self.switches]})

    def _zone_switches(self, cfg: StackConfig, tags: dict[str, str]) -> list[alicloud.vpc.Switch]:
        """One vSwitch per zone."""
        return [
            alicloud.vpc.Switch(
                f"{self.name}-{zone}",
                vpc_id=self.vpc.id,
                cidr_block=cidr,
                zone_id=zone,
                vswitch_name=f"{cfg.name}-{zone}",
                tags=tags,
                opts=self.child,
            )
            for zone, cidr in zip(
                cfg.zones, zone_subnets(cfg.vpc_cidr, len(cfg.zones)), strict=True
            )
        ]

    def _security_group(
        self, suffix: str, what: str, cfg: StackConfig, tags: dict[str, str]
    ) -> alicloud.ecs.SecurityGroup:
        """An empty security group (its rules: _rule)."""
        return alicloud.ecs.SecurityGroup(
            f"{self.name}-{suffix}",
            vpc_id=self.vpc.id,
            security_group_name=f"{cfg.name}-{suffix}",
            description=f"torchfleet {cfg.stack}: {what}",
            tags=tags,
            opts=self.child,
        )

    def _rule(
        self,
        suffix: str,
        kind: str,
        protocol: str,
        ports: str,
        cidr: str | None,
        why: str,
        group: alicloud.ecs.SecurityGroup | None = None,
        source: alicloud.ecs.SecurityGroup | None = None,
    ) -> None:
        """`cidr`, or the members of security group `source`, may reach `group` (default: the
        nodes' group)."""
        v6 = cidr is not None and ipaddress.ip_network(cidr).version == 6
        alicloud.ecs.SecurityGroupRule(
            f"{self.name}-{suffix}",
            security_group_id=(group or self.sg).id,
            type=kind,
            ip_protocol=protocol,
            port_range=ports,
            policy="accept",
            priority=1,
            nic_type="intranet",
            description=why,
            cidr_ip=None if v6 else cidr,
            ipv6_cidr_ip=cidr if v6 else None,
            source_security_group_id=source.id if source else None,
            opts=self.child,
        )

    def _node_rules(self, cfg: StackConfig) -> None:
        """The GPU nodes admit SSH from the admins and the service port from the VPC (and the
        load balancer in group mode); egress open."""
        for i, cidr in enumerate(cfg.admin_cidrs):
            self._rule(
                f"ssh-{i}",
                "ingress",
                "tcp",
                f"{SSH_PORT}/{SSH_PORT}",
                cidr,
                "SSH from admin networks",
            )
        port = f"{cfg.service_port}/{cfg.service_port}"
        self._rule("service-vpc", "ingress", "tcp", port, cfg.vpc_cidr, "service port from the VPC")
        if cfg.mode == "group":
            self._rule(
                "service-clb",
                "ingress",
                "tcp",
                port,
                CLB_SOURCE_RANGE,
                "service port from the load balancer",
            )
        self._rule("egress", "egress", "all", "-1/-1", "0.0.0.0/0", "packages, wheels, models")

    def _monitoring_rules(self, cfg: StackConfig, mon: alicloud.ecs.SecurityGroup) -> None:
        """The nodes admit the scrape ports from the monitoring host; it admits the nodes'
        journal upload and SSH from the admins; its egress is open."""
        for job, scrape in monitoring.scrape_ports(cfg).items():
            self._rule(
                f"scrape-{job}",
                "ingress",
                "tcp",
                f"{scrape}/{scrape}",
                None,
                f"{job} scrape from monitoring",
                source=mon,
            )
        journal = monitoring.journal_port(cfg)
        self._rule(
            "monitoring-journal",
            "ingress",
            "tcp",
            f"{journal}/{journal}",
            None,
            "journal upload from the GPU nodes",
            group=mon,
            source=self.sg,
        )
        for i, cidr in enumerate(cfg.admin_cidrs):
            self._rule(
                f"monitoring-ssh-{i}",
                "ingress",
                "tcp",
                f"{SSH_PORT}/{SSH_PORT}",
                cidr,
                "SSH from admin networks",
                group=mon,
            )
        self._rule(
            "monitoring-egress",
            "egress",
            "all",
            "-1/-1",
            "0.0.0.0/0",
            "packages, the nodes' scrape ports",
            group=mon,
        )

    def _services_switch(
        self, name: str, cfg: StackConfig, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> alicloud.vpc.Switch:
        """The address plan's last block as a vSwitch in the first zone, and the NAT gateway its
        host (which has no public address) reaches the package archive through."""
        switch = alicloud.vpc.Switch(
            f"{name}-services",
            vpc_id=self.vpc.id,
            cidr_block=services_subnet(cfg.vpc_cidr),
            zone_id=cfg.zones[0],
            vswitch_name=f"{cfg.name}-services",
            tags=tags,
            opts=child,
        )
        nat = alicloud.vpc.NatGateway(
            f"{name}-nat",
            vpc_id=self.vpc.id,
            vswitch_id=switch.id,
            nat_type="Enhanced",
            network_type="internet",
            payment_type="PayAsYouGo",
            internet_charge_type="PayByLcu",
            nat_gateway_name=f"{cfg.name}-nat",
            description=f"torchfleet {cfg.stack}: egress of the services vSwitch",
            tags=tags,
            opts=child,
        )
        eip = alicloud.ecs.EipAddress(
            f"{name}-nat",
            address_name=f"{cfg.name}-nat",
            payment_type="PayAsYouGo",
            internet_charge_type="PayByTraffic",
            bandwidth="100",
            tags=tags,
            opts=child,
        )
        bound = alicloud.ecs.EipAssociation(
            f"{name}-nat", allocation_id=eip.id, instance_id=nat.id, instance_type="Nat", opts=child
        )
        alicloud.vpc.SnatEntry(
            f"{name}-services-snat",
            snat_table_id=nat.snat_table_ids,
            source_vswitch_id=switch.id,
            snat_ip=eip.ip_address,
            snat_entry_name=f"{cfg.name}-services",
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[bound])),
        )
        return switch
