"""AWS: VPC network, the node bundle's bucket, an optional baked image (Image Builder), the GPU
fleet (instances or an Auto Scaling group behind an ALB that scales on load), teardown
(working-hours schedules, TTL, budget) and the optional monitoring host."""

from __future__ import annotations

from datetime import datetime

import pulumi
import pulumi_aws as aws

from infra import images
from infra.aws.bake import AwsBake
from infra.aws.bundle_store import AwsBundleStore
from infra.aws.fleet import AwsFleet
from infra.aws.monitoring import AwsMonitoring
from infra.aws.network import AwsNetwork
from infra.aws.teardown import AwsTeardown
from infra.config import StackConfig
from infra.interface import Deployment
from infra.monitoring import DISTRO as MONITORING_DISTRO


def partition(region: str) -> str:
    """ARN partition of a region; China and GovCloud differ from the commercial one."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def resolve_image(
    cfg: StackConfig, opts: pulumi.InvokeOptions, distro: str | None = None
) -> pulumi.Output[str]:
    """The GPU nodes' image (`image`, or the newest of `image_distro`), or with `distro` the
    newest official image of that distro (the monitoring host's)."""
    if cfg.image != "auto" and distro is None:
        return pulumi.Output.from_input(cfg.image)
    q = images.query("aws", distro or cfg.image_distro)
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
    invoke = pulumi.InvokeOptions(provider=provider)
    arn_partition = partition(cfg.region)
    account = aws.get_caller_identity_output(opts=invoke).account_id
    if cfg.mode == "kubernetes":  # an EKS cluster instead of a fleet (infra/aws/cluster.py)
        from infra.aws.cluster import EksCluster
        from infra.k8s.component import deploy_kubernetes  # pulumi_kubernetes: this mode only

        network = AwsNetwork("net", cfg, tags, opts=opts)
        cluster = EksCluster("cluster", cfg, tags, network, arn_partition, opts=opts)
        deployment = deploy_kubernetes(cfg, cluster)
        AwsTeardown(
            "teardown",
            cfg,
            tags,
            cluster,
            expiry,
            arn_partition,
            account,
            opts=opts,
        )
        return deployment
    image_id = resolve_image(cfg, invoke)
    network = AwsNetwork("net", cfg, tags, opts=opts)
    store = AwsBundleStore("bundle", cfg, tags, opts=opts)
    if cfg.boot == "bake":
        image_id = AwsBake(
            "bake", cfg, tags, network, store, image_id, arn_partition, opts=opts
        ).image_id
    fleet = AwsFleet(
        "fleet", cfg, tags, network, store, image_id, account, arn_partition, opts=opts
    )
    AwsTeardown("teardown", cfg, tags, fleet, expiry, arn_partition, account, opts=opts)
    deployment = fleet.deployment
    deployment.extra_outputs.update(store.outputs, api_token=fleet.token, **fleet.edge_outputs)
    if cfg.monitoring:
        assert fleet.journal is not None  # made with the nodes' grants (aws/fleet.py)
        deployment.monitoring = AwsMonitoring(
            "monitoring",
            cfg,
            tags,
            network,
            fleet.key,
            resolve_image(cfg, invoke, distro=MONITORING_DISTRO),
            arn_partition,
            fleet.journal,
            opts=opts,
        ).host
    return deployment
