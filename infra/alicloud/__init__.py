"""Alibaba Cloud: VPC and vSwitches, the node bundle's OSS bucket, GPU fleet (ECS spot
instances with a real price cap, or an ESS scaling group behind a CLB health-checking /readyz
that scales on load) and teardown (OOS / ESS schedules and the instances' own auto-release time
as the TTL)."""

from __future__ import annotations

from datetime import datetime

import pulumi
import pulumi_alicloud as alicloud

from infra import images
from infra.alicloud.bundle_store import AlicloudBundleStore
from infra.alicloud.fleet import AlicloudFleet
from infra.alicloud.network import AlicloudNetwork
from infra.alicloud.teardown import AlicloudTeardown
from infra.config import StackConfig
from infra.interface import Deployment


def resolve_image(cfg: StackConfig, opts: pulumi.InvokeOptions) -> pulumi.Output[str]:
    if cfg.image != "auto":
        return pulumi.Output.from_input(cfg.image)
    q = images.query("alicloud", cfg.image_distro)
    found = alicloud.ecs.get_images_output(
        owners=q.owner, name_regex=q.name_pattern, most_recent=True, architecture="x86_64",
        instance_type=cfg.instance_type.name, opts=opts)

    def first(ids: list[str]) -> str:
        if not ids:
            raise ValueError(f"torchfleet:image = 'auto' found no {cfg.image_distro} image for "
                             f"{cfg.instance_type.name} in {cfg.region}; set an image id")
        return ids[0]

    return found.ids.apply(first)


def deploy(cfg: StackConfig, tags: dict[str, str], expiry: datetime | None) -> Deployment:
    provider = alicloud.Provider("alicloud", region=cfg.region)
    opts = pulumi.ResourceOptions(provider=provider)
    if cfg.mode == "kubernetes":  # an ACK cluster instead of a fleet (infra/alicloud/cluster.py)
        from infra.alicloud.cluster import deploy_kubernetes

        network = AlicloudNetwork("net", cfg, tags, opts=opts)
        cluster, deployment = deploy_kubernetes(cfg, tags, network, opts,
                                                pulumi.InvokeOptions(provider=provider))
        AlicloudTeardown("teardown", cfg, tags, cluster, expiry, opts=opts)
        return deployment
    image_id = resolve_image(cfg, pulumi.InvokeOptions(provider=provider))
    network = AlicloudNetwork("net", cfg, tags, opts=opts)
    store = AlicloudBundleStore("bundle", cfg, tags, opts=opts)
    fleet = AlicloudFleet("fleet", cfg, tags, network, store, image_id, expiry, opts=opts)
    AlicloudTeardown("teardown", cfg, tags, fleet, expiry, opts=opts)
    deployment = fleet.deployment
    deployment.extra_outputs.update(store.outputs)
    return deployment
