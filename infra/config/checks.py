"""Rules between keys of different sections that no single key's parser owns, as plain
functions over the values the parsers returned (`got`, by record field name). A rule that one
key's parser can judge from the keys before it lives in that parser instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.config.fleet import POOL_MODES
from infra.config.reader import Reader


def cross_checks(r: Reader, got: Mapping[str, Any]) -> None:
    """Every rule below, in this order (each records its problems on `r`)."""
    _placement(r, got)
    _fleet(r, got)


def _placement(r: Reader, got: Mapping[str, Any]) -> None:
    """Zones, reachability, office hours and spot against the mode."""
    cloud, env, mode, zones = got["cloud"], got["env"], got["mode"], got["zones"]
    nodes, spot, schedule, client = got["nodes"], got["spot"], got["schedule"], got["client_cidrs"]
    if mode == "group" and len(zones) < 2:
        r.fail(
            "zones",
            list(zones),
            "at least 2 zones in mode: group (the load balancer and the group span zones)",
        )
    if mode == "instances" and client:
        r.fail(
            "client_cidrs",
            list(client),
            "unset in mode: instances (there is no load "
            "balancer; reach nodes through SSH from admin_cidrs)",
        )
    if env == "dev" and schedule is None:
        r.fail(
            "schedule",
            None,
            "a working-hours schedule {timezone, start, stop, days}: dev "
            "stacks stop outside working hours",
        )
    if (
        cloud == "aws"
        and mode == "instances"
        and schedule is not None
        and spot is not None
        and spot.enabled
        and spot.interruption == "terminate"
    ):
        r.fail(
            "spot.interruption",
            spot.interruption,
            "stop | hibernate when a schedule stops "
            "spot instances (AWS stops only persistent spot requests that stop on interruption)",
        )
    if (
        mode in POOL_MODES
        and nodes is not None
        and spot is not None
        and spot.enabled
        and spot.on_demand_base > nodes.max
    ):
        r.fail("spot.on_demand_base", spot.on_demand_base, f"at most nodes.max ({nodes.max})")


def _fleet(r: Reader, got: Mapping[str, Any]) -> None:
    """The boot path against the image, and the warm pool against spot and the node counts."""
    image, boot, nodes = got["image"], got["boot"], got["nodes"]
    spot, warm_pool = got["spot"], got["warm_pool"]
    if boot == "baked" and image == "auto":
        r.fail(
            "boot",
            boot,
            "cold | bake with image: auto (baked needs `image` set to an image a bake produced)",
        )
    if warm_pool is None:
        return
    if spot is not None and spot.enabled:
        r.fail(
            "warm_pool",
            "enabled",
            "unset with spot.enabled (AWS warm pools take no spot instances)",
        )
    if nodes is not None and warm_pool.min_size > nodes.max:
        r.fail("warm_pool.min_size", warm_pool.min_size, f"at most nodes.max ({nodes.max})")
    if (
        nodes is not None
        and warm_pool.max_prepared is not None
        and warm_pool.max_prepared < max(nodes.desired, warm_pool.min_size)
    ):
        r.fail(
            "warm_pool.max_prepared",
            warm_pool.max_prepared,
            f"at least nodes.desired and warm_pool.min_size "
            f"({max(nodes.desired, warm_pool.min_size)})",
        )
