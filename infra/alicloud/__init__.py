"""Alibaba Cloud: VPC and vSwitches, the node bundle's OSS bucket, GPU fleet (ECS spot
instances with a real price cap, or an ESS scaling group behind a CLB health-checking /readyz
that scales on load), teardown (OOS / ESS schedules and the instances' own auto-release time
as the TTL) and the optional monitoring host."""

from __future__ import annotations

from datetime import datetime

import pulumi
import pulumi_alicloud as alicloud

from infra import images
from infra.alicloud.bundle_store import AlicloudBundleStore
from infra.alicloud.fleet import AlicloudFleet
from infra.alicloud.monitoring import AlicloudMonitoring
from infra.alicloud.network import AlicloudNetwork
from infra.alicloud.teardown import AlicloudTeardown
from infra.config import StackConfig
from infra.interface import Deployment
from infra.monitoring import DISTRO as MONITORING_DISTRO


def resolve_image(
    cfg: StackConfig,
    opts: pulumi.InvokeOptions,
    distro: str | None = None,
    instance_type: str | None = None,
) -> pulumi.Output[str]:
    """The GPU nodes' image (`image`, or the newest of `image_distro` for their type), or with
    `distro` the newest system image of that distro for `instance_type` (the monitoring host)."""
    if cfg.image != "auto" and distro is None:
        return pulumi.Output.from_input(cfg.image)
    distro, itype = distro or cfg.image_distro, instance_type or cfg.instance_type.name
    q = images.query("alicloud", distro)
    found = alicloud.ecs.get_images_output(
        owners=q.owner,
        name_regex=q.name_pattern,
        most_recent=True,
        architecture="x86_64",
        instance_type=itype,
        opts=opts,
    )

    def first(ids: list[str]) -> str:
        if not ids:
            key = "image" if distro == cfg.image_distro else "monitoring"
            raise ValueError(
                f"torchfleet:{key}: no {distro} image for {itype} in {cfg.region}"
                + ("; set an image id" if key == "image" else "")
            )
        return ids[0]

    return found.ids.apply(first)


def deploy(cfg: StackConfig, tags: dict[str, str], expiry: datetime | None) -> Deployment:
    provider = alicloud.Provider("alicloud", region=cfg.region)
    opts = pulumi.ResourceOptions(provider=provider)
    if cfg.mode == "kubernetes":  # an ACK cluster instead of a fleet (infra/alicloud/cluster.py)
        from infra.alicloud.cluster import AckCluster
        from infra.k8s.component import deploy_kubernetes  # pulumi_kubernetes: this mode only

        network = AlicloudNetwork("net", cfg, tags, opts=opts)
        invoke = pulumi.InvokeOptions(provider=provider)
        cluster = AckCluster("cluster", cfg, tags, network, opts=opts, invoke_opts=invoke)
        deployment = deploy_kubernetes(cfg, cluster)
        AlicloudTeardown("teardown", cfg, tags, cluster, expiry, opts=opts)
        return deployment
    image_id = resolve_image(cfg, pulumi.InvokeOptions(provider=provider))
    network = AlicloudNetwork("net", cfg, tags, opts=opts)
    store = AlicloudBundleStore("bundle", cfg, tags, opts=opts)
    fleet = AlicloudFleet("fleet", cfg, tags, network, store, image_id, expiry, opts=opts)
    AlicloudTeardown("teardown", cfg, tags, fleet, expiry, opts=opts)
    deployment = fleet.deployment
    deployment.extra_outputs.update(store.outputs, api_token=fleet.token, **fleet.edge_outputs)
    if cfg.monitoring:
        image = resolve_image(
            cfg,
            pulumi.InvokeOptions(provider=provider),
            distro=MONITORING_DISTRO,
            instance_type=cfg.monitoring.instance_type.name,
        )
        assert fleet.journal is not None  # made with the nodes' grants (alicloud/fleet.py)
        deployment.monitoring = AlicloudMonitoring(
            "monitoring", cfg, tags, network, fleet.key, image, fleet.journal, opts=opts
        ).host
    return deployment
