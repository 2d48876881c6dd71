"""VPC, one public subnet per zone, routing through an internet gateway, and the security
groups: SSH only from the admin CIDRs, the service port only from the VPC (instances) or the
load balancer (group), egress open. With `monitoring.enabled` also the private services subnet
(egress through a NAT gateway) and the monitoring host's security group: the GPU nodes admit
the scrape ports from it only, it admits the journal upload from the GPU nodes only and SSH
from the admin CIDRs (infra.monitoring)."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra import monitoring
from infra.addressing import services_subnet, split_cidrs, zone_subnets
from infra.config import StackConfig
from infra.edge import lb_ports
from infra.tags import with_name

SSH_PORT = 22


def tcp_ingress(
    port: int,
    description: str,
    *,
    cidr_blocks: pulumi.Input[list[str]] | None = None,
    ipv6_cidr_blocks: pulumi.Input[list[str]] | None = None,
    security_groups: list[pulumi.Input[str]] | None = None,
) -> aws.ec2.SecurityGroupIngressArgs:
    """One TCP port admitted from CIDRs or from other security groups."""
    return aws.ec2.SecurityGroupIngressArgs(
        protocol="tcp",
        from_port=port,
        to_port=port,
        cidr_blocks=cidr_blocks,
        ipv6_cidr_blocks=ipv6_cidr_blocks,
        security_groups=security_groups,
        description=description,
    )


def open_egress(description: str, *, ipv6: bool) -> aws.ec2.SecurityGroupEgressArgs:
    """Every protocol to anywhere (IPv4, and IPv6 with `ipv6`)."""
    return aws.ec2.SecurityGroupEgressArgs(
        protocol="-1",
        from_port=0,
        to_port=0,
        cidr_blocks=["0.0.0.0/0"],
        ipv6_cidr_blocks=["::/0"] if ipv6 else None,
        description=description,
    )


class AwsNetwork(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:aws:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=cfg.vpc_cidr,
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags=with_name(tags, f"{cfg.name}-vpc"),
            opts=child,
        )
        self.subnets = self._public_subnets(name, cfg, tags, child)
        self.lb_sg = self._lb_group(name, cfg, tags, child) if cfg.mode == "group" else None
        # Created before the nodes' group, which names it; its own rules come after it.
        self.monitoring_sg: aws.ec2.SecurityGroup | None = None
        self.services_subnet: aws.ec2.Subnet | None = None
        if cfg.monitoring:
            self.services_subnet = self._services_subnet(name, cfg, tags, child)
            self.monitoring_sg = self._monitoring_group(name, cfg, tags, child)
        self.node_sg = self._node_group(name, cfg, tags, child)
        if self.monitoring_sg is not None:
            self._monitoring_ingress(name, cfg, tags, child)
        self.register_outputs({"vpc_id": self.vpc.id, "subnet_ids": [s.id for s in self.subnets]})

    def _public_subnets(
        self, name: str, cfg: StackConfig, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> list[aws.ec2.Subnet]:
        """One subnet per zone, routed to the internet through the VPC's gateway."""
        igw = aws.ec2.InternetGateway(
            f"{name}-igw", vpc_id=self.vpc.id, tags=with_name(tags, f"{cfg.name}-igw"), opts=child
        )
        routes = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=self.vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags=with_name(tags, f"{cfg.name}-public"),
            opts=child,
        )
        subnets: list[aws.ec2.Subnet] = []
        for zone, cidr in zip(cfg.zones, zone_subnets(cfg.vpc_cidr, len(cfg.zones)), strict=True):
            subnet = aws.ec2.Subnet(
                f"{name}-{zone}",
                vpc_id=self.vpc.id,
                cidr_block=cidr,
                availability_zone=zone,
                # Nodes pull drivers and wheels; a public address is cheaper than a NAT gateway
                # and the security group still admits nothing from outside but SSH from admins.
                map_public_ip_on_launch=True,
                tags=with_name(tags, f"{cfg.name}-{zone}"),
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-{zone}-route", subnet_id=subnet.id, route_table_id=routes.id, opts=child
            )
            subnets.append(subnet)
        return subnets

    def _lb_group(
        self, name: str, cfg: StackConfig, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> aws.ec2.SecurityGroup:
        """The load balancer's group (group mode): an internal ALB (VPC only) unless client
        CIDRs are named."""
        clients_v4, clients_v6 = split_cidrs(cfg.client_cidrs or (cfg.vpc_cidr,))
        return aws.ec2.SecurityGroup(
            f"{name}-lb",
            vpc_id=self.vpc.id,
            description=f"torchfleet {cfg.stack}: load balancer",
            ingress=[
                tcp_ingress(
                    port,
                    "inference clients",
                    cidr_blocks=clients_v4,
                    ipv6_cidr_blocks=clients_v6,
                )
                for port in lb_ports(cfg)
            ],
            egress=[
                aws.ec2.SecurityGroupEgressArgs(
                    protocol="tcp",
                    from_port=cfg.service_port,
                    to_port=cfg.service_port,
                    cidr_blocks=[cfg.vpc_cidr],
                    description="to the nodes' service port",
                )
            ],
            tags=with_name(tags, f"{cfg.name}-lb"),
            opts=child,
        )

    def _monitoring_group(
        self, name: str, cfg: StackConfig, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> aws.ec2.SecurityGroup:
        return aws.ec2.SecurityGroup(
            f"{name}-monitoring",
            vpc_id=self.vpc.id,
            description=f"torchfleet {cfg.stack}: monitoring host",
            # ingress: separate rules (_monitoring_ingress: they name the nodes' group, created
            # after this one)
            egress=[open_egress("packages, the EC2 API, the nodes' scrape ports", ipv6=False)],
            tags=with_name(tags, f"{cfg.name}-monitoring"),
            opts=child,
        )

    def _node_group(
        self, name: str, cfg: StackConfig, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> aws.ec2.SecurityGroup:
        """The GPU nodes' group: SSH from the admins, the service port from the load balancer
        (group mode) or the VPC, the scrape ports from the monitoring host."""
        admin_v4, admin_v6 = split_cidrs(cfg.admin_cidrs)
        if self.lb_sg is not None:
            service = tcp_ingress(
                cfg.service_port,
                "service port from the load balancer",
                security_groups=[self.lb_sg.id],
            )
        else:
            service = tcp_ingress(
                cfg.service_port, "service port from inside the VPC", cidr_blocks=[cfg.vpc_cidr]
            )
        scrapes = (
            []
            if self.monitoring_sg is None
            else [
                tcp_ingress(
                    port, f"{job} scrape from monitoring", security_groups=[self.monitoring_sg.id]
                )
                for job, port in monitoring.scrape_ports(cfg).items()
            ]
        )
        return aws.ec2.SecurityGroup(
            f"{name}-nodes",
            vpc_id=self.vpc.id,
            description=f"torchfleet {cfg.stack}: GPU nodes",
            ingress=[
                tcp_ingress(
                    SSH_PORT,
                    "SSH from admin networks",
                    cidr_blocks=admin_v4,
                    ipv6_cidr_blocks=admin_v6,
                ),
                service,
                *scrapes,
            ],
            egress=[open_egress("packages, wheels, models", ipv6=True)],
            tags=with_name(tags, f"{cfg.name}-nodes"),
            opts=child,
        )

    def _services_subnet(
        self, name: str, cfg: StackConfig, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> aws.ec2.Subnet:
        """The private subnet of the address plan's last block, in the first zone, whose
        default route is a NAT gateway in that zone's public subnet."""
        subnet = aws.ec2.Subnet(
            f"{name}-services",
            vpc_id=self.vpc.id,
            cidr_block=services_subnet(cfg.vpc_cidr),
            availability_zone=cfg.zones[0],
            map_public_ip_on_launch=False,
            tags=with_name(tags, f"{cfg.name}-services"),
            opts=child,
        )
        eip = aws.ec2.Eip(
            f"{name}-nat", domain="vpc", tags=with_name(tags, f"{cfg.name}-nat"), opts=child
        )
        nat = aws.ec2.NatGateway(
            f"{name}-nat",
            allocation_id=eip.allocation_id,
            subnet_id=self.subnets[0].id,
            tags=with_name(tags, f"{cfg.name}-nat"),
            opts=child,
        )
        routes = aws.ec2.RouteTable(
            f"{name}-private",
            vpc_id=self.vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)],
            tags=with_name(tags, f"{cfg.name}-private"),
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-services-route", subnet_id=subnet.id, route_table_id=routes.id, opts=child
        )
        return subnet

    def _monitoring_ingress(
        self, name: str, cfg: StackConfig, tags: dict[str, str], child: pulumi.ResourceOptions
    ) -> None:
        """Everything the monitoring host admits: the nodes' journal upload, SSH from admins."""
        assert self.monitoring_sg is not None
        port = monitoring.journal_port(cfg)
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-monitoring-journal",
            security_group_id=self.monitoring_sg.id,
            ip_protocol="tcp",
            from_port=port,
            to_port=port,
            referenced_security_group_id=self.node_sg.id,
            description="journal upload from the GPU nodes",
            tags=tags,
            opts=child,
        )
        for i, cidr in enumerate(cfg.admin_cidrs):
            v6 = ":" in cidr
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-monitoring-ssh-{i}",
                security_group_id=self.monitoring_sg.id,
                ip_protocol="tcp",
                from_port=SSH_PORT,
                to_port=SSH_PORT,
                cidr_ipv4=None if v6 else cidr,
                cidr_ipv6=cidr if v6 else None,
                description="SSH from admin networks",
                tags=tags,
                opts=child,
            )
