"""AWS: VPC network, GPU fleet (instances or a mixed-instances Auto Scaling group behind an
ALB) and teardown (working-hours schedules, TTL, budget)."""

from __future__ import annotations

from datetime import datetime

import pulumi
import pulumi_aws as aws

from infra import images
from infra.aws.fleet import AwsFleet
from infra.aws.network import AwsNetwork
from infra.aws.teardown import AwsTeardown
from infra.config import StackConfig
from infra.interface import Deployment


def partition(region: str) -> str:
    """ARN partition of a region; China and GovCloud differ from the commercial one."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def resolve_image(cfg: StackConfig, opts: pulumi.InvokeOptions) -> pulumi.Output[str]:
    if cfg.image != "auto":
        return pulumi.Output.from_input(cfg.image)
    q = images.query("aws", cfg.image_distro)
    ami = aws.ec2.get_ami_output(
        most_recent=True,
        owners=[q.owner],
        filters=[
            aws.ec2.GetAmiFilterArgs(name="name", values=[q.name_pattern]),
            aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"]),
            aws.ec2.GetAmiFilterArgs(name="virtualization-type", values=["hvm"]),
        ],
        opts=opts,
    )
    return ami.id


def deploy(cfg: StackConfig, tags: dict[str, str], expiry: datetime | None) -> Deployment:
    provider = aws.Provider("aws", region=cfg.region)
    opts = pulumi.ResourceOptions(provider=provider)
    if cfg.mode == "kubernetes":  # an EKS cluster instead of a fleet (infra/aws/cluster.py)
        from infra.aws.cluster import deploy_kubernetes
        from infra.k8s.cost import cluster_cost

        network = AwsNetwork("net", cfg, tags, opts=opts)
        cluster, deployment = deploy_kubernetes(cfg, tags, network, partition(cfg.region), opts)
        AwsTeardown("teardown", cfg, tags, cluster, expiry, partition(cfg.region), opts=opts,
                    monthly_estimate_usd=cluster_cost(cfg).monthly_max_usd)
        return deployment
    image_id = resolve_image(cfg, pulumi.InvokeOptions(provider=provider))
    network = AwsNetwork("net", cfg, tags, opts=opts)
    fleet = AwsFleet("fleet", cfg, tags, network, image_id, partition(cfg.region), opts=opts)
    AwsTeardown("teardown", cfg, tags, fleet, expiry, partition(cfg.region), opts=opts)
    return fleet.deployment
