"""The Pulumi program: config -> cloud -> components -> exports.

`run()` validates every `torchfleet:` value before the first resource is registered, so a bad
stack file fails with the key, the value and what is allowed, and leaves nothing behind."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pulumi
from pulumi.runtime.config import CONFIG, get_config_env

from infra import config, inventory, pricing
from infra.config import StackConfig
from infra.cost import estimate, priced_types
from infra.interface import Deployment
from infra.market import fallback_reason
from infra.schedule import iso_utc, ttl_expiry
from infra.tags import base_tags


def _backend(cloud: str) -> Callable[[StackConfig, dict[str, str], datetime | None], Deployment]:
    # Imported lazily: a stack loads one cloud's SDK, not both.
    if cloud == "aws":
        from infra.aws import deploy
    else:
        from infra.alicloud import deploy
    return deploy


def current_config() -> dict[str, Any]:
    """Every config value of this run: the engine's explicit config over PULUMI_CONFIG."""
    return {**get_config_env(), **CONFIG.get()}


def with_region_prices(cfg: StackConfig, mode: str | None = None) -> StackConfig:
    """The config with the prices of its region (infra.pricing: `mode` None reads
    TORCHFLEET_PRICES, default auto), before any cap or estimate is computed."""
    book = pricing.resolve(cfg.cloud, cfg.region, cfg.zones, priced_types(cfg), mode)
    return cfg.with_prices(book)


def bundle_bytes(cfg: StackConfig) -> int:
    if cfg.mode == "kubernetes":
        return 0  # no bundle: the nodes run the runtime image
    from infra.nodeboot import stack_bundle

    return stack_bundle(cfg).path.stat().st_size


def run(prices: str | None = None) -> dict[str, Any]:
    """`prices`: the pricing mode (infra.pricing.MODES); None: $TORCHFLEET_PRICES or auto."""
    cfg = config.load(config.raw_from_pulumi_config(current_config()), pulumi.get_stack())
    cfg = with_region_prices(cfg, prices)
    if reason := fallback_reason(cfg):  # `up` retries on-demand after a spot capacity error
        cfg = cfg.with_fallback(reason)
    expiry = ttl_expiry(cfg.ttl_hours) if cfg.ttl_hours else None
    tags = base_tags(cfg, expiry)
    deployment = _backend(cfg.cloud)(cfg, tags, expiry)
    outputs: dict[str, Any] = {
        "inventory": inventory.build(cfg, deployment),
        "endpoint": deployment.endpoint,
        "cost": estimate(cfg, bundle_bytes(cfg)).as_dict(),
        "ttl_expiry": iso_utc(expiry) if expiry else None,
        **deployment.extra_outputs,
    }
    if deployment.discovery:
        outputs["discovery"] = deployment.discovery
    if cfg.mode == "kubernetes":
        from infra.k8s.workload import names

        outputs["workload"] = names(cfg)  # where torchfleet up|status|rollout look
    for key, value in outputs.items():
        pulumi.export(key, value)
    return outputs
