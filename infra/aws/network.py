"""VPC, one public subnet per zone, routing through an internet gateway, and the security
groups: SSH only from the admin CIDRs, the service port only from the VPC (instances) or the
load balancer (group), egress open."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.addressing import split_cidrs, zone_subnets
from infra.config import StackConfig
from infra.tags import with_name

SSH_PORT = 22
LB_PORT = 80


class AwsNetwork(pulumi.ComponentResource):
    def __init__(self, name: str, cfg: StackConfig, tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("torchfleet:aws:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.vpc = aws.ec2.Vpc(
            f"{name}-vpc", cidr_block=cfg.vpc_cidr, enable_dns_hostnames=True,
            enable_dns_support=True, tags=with_name(tags, f"{cfg.name}-vpc"), opts=child)
        igw = aws.ec2.InternetGateway(
            f"{name}-igw", vpc_id=self.vpc.id, tags=with_name(tags, f"{cfg.name}-igw"), opts=child)
        routes = aws.ec2.RouteTable(
            f"{name}-public", vpc_id=self.vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags=with_name(tags, f"{cfg.name}-public"), opts=child)
        self.subnets: list[aws.ec2.Subnet] = []
        for zone, cidr in zip(cfg.zones, zone_subnets(cfg.vpc_cidr, len(cfg.zones)), strict=True):
            subnet = aws.ec2.Subnet(
                f"{name}-{zone}", vpc_id=self.vpc.id, cidr_block=cidr, availability_zone=zone,
                # Nodes pull drivers and wheels; a public address is cheaper than a NAT gateway
                # and the security group still admits nothing from outside but SSH from admins.
                map_public_ip_on_launch=True,
                tags=with_name(tags, f"{cfg.name}-{zone}"), opts=child)
            aws.ec2.RouteTableAssociation(
                f"{name}-{zone}-route", subnet_id=subnet.id, route_table_id=routes.id, opts=child)
            self.subnets.append(subnet)

        self.lb_sg: aws.ec2.SecurityGroup | None = None
        if cfg.mode == "group":
            # An internal ALB (VPC only) unless client CIDRs are named.
            clients_v4, clients_v6 = split_cidrs(cfg.client_cidrs or (cfg.vpc_cidr,))
            self.lb_sg = aws.ec2.SecurityGroup(
                f"{name}-lb", vpc_id=self.vpc.id,
                description=f"torchfleet {cfg.stack}: load balancer",
                ingress=[aws.ec2.SecurityGroupIngressArgs(
                    protocol="tcp", from_port=LB_PORT, to_port=LB_PORT, cidr_blocks=clients_v4,
                    ipv6_cidr_blocks=clients_v6, description="inference clients")],
                egress=[aws.ec2.SecurityGroupEgressArgs(
                    protocol="tcp", from_port=cfg.service_port, to_port=cfg.service_port,
                    cidr_blocks=[cfg.vpc_cidr], description="to the nodes' service port")],
                tags=with_name(tags, f"{cfg.name}-lb"), opts=child)

        admin_v4, admin_v6 = split_cidrs(cfg.admin_cidrs)
        service = (
            aws.ec2.SecurityGroupIngressArgs(
                protocol="tcp", from_port=cfg.service_port, to_port=cfg.service_port,
                security_groups=[self.lb_sg.id], description="service port from the load balancer")
            if self.lb_sg is not None else
            aws.ec2.SecurityGroupIngressArgs(
                protocol="tcp", from_port=cfg.service_port, to_port=cfg.service_port,
                cidr_blocks=[cfg.vpc_cidr], description="service port from inside the VPC"))
        self.node_sg = aws.ec2.SecurityGroup(
            f"{name}-nodes", vpc_id=self.vpc.id, description=f"torchfleet {cfg.stack}: GPU nodes",
            ingress=[
                aws.ec2.SecurityGroupIngressArgs(
                    protocol="tcp", from_port=SSH_PORT, to_port=SSH_PORT, cidr_blocks=admin_v4,
                    ipv6_cidr_blocks=admin_v6, description="SSH from admin networks"),
                service,
            ],
            egress=[aws.ec2.SecurityGroupEgressArgs(
                protocol="-1", from_port=0, to_port=0, cidr_blocks=["0.0.0.0/0"],
                ipv6_cidr_blocks=["::/0"], description="packages, wheels, models")],
            tags=with_name(tags, f"{cfg.name}-nodes"), opts=child)
        self.register_outputs({"vpc_id": self.vpc.id,
                               "subnet_ids": [s.id for s in self.subnets]})
