"""The fleet section: which cloud, where, how many nodes of which GPU type, bought how.

Each key is one field of `Fleet` (infra/config/keys.py says how a key is declared); the
parsers above it read the raw values. The nodes' own records (Nodes, Spot, Scaling, WarmPool)
are here too: each field is a sub-key of the block that sets it, declared with `sub(...)`; the
block's parser keeps the rules between them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra import catalog
from infra.addressing import BLOCKS, MAX_ZONES
from infra.catalog import InstanceType
from infra.config.keys import REQUIRED, Key, flag, integer, key, one_of, real, sub, switch
from infra.config.reader import Reader
from infra.lifecycle import GPU_TARGET_DEFAULT, GPU_TARGET_RANGE, LAUNCH_TIMEOUT_DEFAULT_S

CLOUDS = ("aws", "alicloud")
ENVS = ("dev", "prod")
MODES = ("instances", "group", "kubernetes")
POOL_MODES = ("group", "kubernetes")  # modes whose nodes come from a pool of instance types
INTERRUPTION = {"aws": ("terminate", "stop", "hibernate"), "alicloud": ("terminate", "stop")}
MAX_PRICE_RATIO = 1.3  # spot cap ceiling: paying more than 1.3x on-demand is never worth it
# When spot cannot be had: on-demand fills in (instances: `up` retries the node on-demand; AWS
# group: the on-demand fallback group; Alibaba group: ESS compensates), or the nodes stay short.
SPOT_FALLBACKS = ("on_demand", "fail")
# The launching hook's heartbeat timeout bounds: AWS accepts 30..7200 s, ESS 30..21600 s; below
# 300 s not even a baked node can be ready (image boot + model fetch + warm-up).
LAUNCH_TIMEOUT_RANGE = (300, 7200)
_REGION_RE = {
    "aws": re.compile(r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$"),
    "alicloud": re.compile(r"^[a-z]{2}-[a-z0-9]+(-[a-z0-9]+)?$"),
}


def _ratio(r: Reader, path: str, value: Any, got: Mapping[str, Any]) -> float | None:
    ratio = r.number(path, value, float, None, MAX_PRICE_RATIO)
    if ratio is not None and ratio <= 0:
        r.fail(path, ratio)
        return None
    return ratio


def _interruption(r: Reader, path: str, value: Any, got: Mapping[str, Any]) -> str | None:
    return r.choice(path, value, INTERRUPTION[got["cloud"]])


def _prices(r: Reader, path: str, prices: Any, got: Mapping[str, Any]) -> dict[str, float]:
    """Instance type -> on-demand price per hour; a bad entry is a problem and left out."""
    if not isinstance(prices, dict):
        r.fail(path, prices)
        return {}
    out = {}
    for name, price in prices.items():
        if catalog.lookup(got["cloud"], name) is None:
            r.fail(path, name, "instance types of the catalog")
        value = r.number(f"{path}.{name}", price, float, 0.0001, None, "a price > 0")
        if value is not None:
            out[name] = value
    return out


@dataclass(frozen=True, kw_only=True)
class Nodes:
    count: int = sub(
        "integer", "nodes in mode: instances", "an integer 1..20", 1, read=integer(1, 20)
    )
    min: int = sub(
        "integer", "the group's fewest nodes", "an integer 0..100", 1, read=integer(0, 100)
    )
    max: int = sub(
        "integer",
        "the group's most nodes",
        "an integer 1..100",
        lambda got, subs: max(subs["min"] or 1, 2),
        derived="min, at least 2",
        read=integer(1, 100),
    )
    desired: int = sub(
        "integer",
        "the group's nodes to start with",
        "an integer 0..100",
        lambda got, subs: subs["min"] or 1,
        derived="min, at least 1",
        read=integer(0, 100),
    )


@dataclass(frozen=True, kw_only=True)
class Spot:
    enabled: bool = sub("boolean", "buy spot capacity", "true | false", False, read=flag)
    max_price_ratio: float = sub(
        "number",
        "the spot price cap as a ratio of the on-demand price",
        f"a number > 0 and <= {MAX_PRICE_RATIO} (the cap is this ratio x on-demand)",
        1.0,
        read=_ratio,
    )
    on_demand_base: int = sub(
        "integer",
        "on-demand nodes before any spot (group mode)",
        "an integer 0..100 (on-demand nodes before any spot)",
        0,
        read=integer(0, 100),
    )
    on_demand_percentage: int = sub(
        "integer",
        "the on-demand share above the base (group mode)",
        "an integer percentage 0..100 of on-demand above the base",
        0,
        read=integer(0, 100),
    )
    interruption: str = sub(
        "string",
        "what a spot interruption does to a node",
        "; ".join(f"{' | '.join(v)} ({c})" for c, v in INTERRUPTION.items()),
        "terminate",
        read=_interruption,
    )
    on_demand_prices: Mapping[str, float] = sub(
        "mapping",
        "the account's on-demand prices, where they differ from the catalog's",
        "a map of instance type -> price per hour in the account's currency",
        {},
        read=_prices,
    )
    fallback: str = sub(
        "string",
        "when spot cannot be had: on-demand fills in, or the nodes stay short",
        " | ".join(SPOT_FALLBACKS),
        "on_demand",
        read=one_of(SPOT_FALLBACKS),
    )


@dataclass(frozen=True, kw_only=True)
class Scaling:
    """Scaling on load (group mode): the per-node targets the policies track."""

    # ALBRequestCountPerTarget's unit
    requests_per_node: float = sub(
        "number",
        "requests per node per minute the request policy holds",
        "requests per node per minute the request policy holds the group at (> 0): 0.7 x "
        "the sustained req/s `torchfleet-bench load URL` measures on one node, x 60",
        REQUIRED,
        read=real(0.001, 1e7),
    )
    queue_depth_per_node: float | None = sub(  # None: derived (infra.lifecycle)
        "number",
        "requests waiting per node the queue policy holds",
        "a number > 0 of requests waiting per node (Average over the group)",
        derived="from requests_per_node",
        read=real(0.01, 1e5),
    )
    gpu_utilization_percent: float = sub(
        "number",
        "the mean GPU utilisation per node the GPU policy holds",
        f"a number in {GPU_TARGET_RANGE[0]}..{GPU_TARGET_RANGE[1]}: the mean GPU utilisation "
        "per node the GPU policy holds",
        GPU_TARGET_DEFAULT,
        read=real(*GPU_TARGET_RANGE),
    )
    scale_in: bool = sub(
        "boolean", "false: the load policies only ever add nodes", "true | false", True, read=flag
    )
    protect_from_scale_in: bool = sub(
        "boolean",
        "new nodes are protected; only schedules and operators remove them",
        "true | false",
        False,
        read=flag,
    )
    launch_timeout_s: int = sub(
        "integer",
        "the launching lifecycle hook's heartbeat timeout",
        f"an integer number of seconds in {LAUNCH_TIMEOUT_RANGE[0]}..{LAUNCH_TIMEOUT_RANGE[1]} "
        "(the launching lifecycle hook's heartbeat timeout; AWS allows at most 7200)",
        LAUNCH_TIMEOUT_DEFAULT_S,
        read=integer(*LAUNCH_TIMEOUT_RANGE),
    )


@dataclass(frozen=True, kw_only=True)
class WarmPool:
    min_size: int = sub(
        "integer", "stopped nodes the pool keeps", "an integer 0..100", 0, read=integer(0, 100)
    )
    max_prepared: int | None = sub(  # None: AWS keeps max_size - desired warm
        "integer",
        "nodes in the group and the pool together",
        "an integer 1..100: nodes in the group and the pool together",
        derived="AWS's: nodes.max - nodes.desired in the pool",
        read=integer(1, 100),
    )


def _stack_parts(stack: str) -> tuple[str | None, str | None]:
    cloud, _, env = stack.partition("-")
    return (cloud if cloud in CLOUDS else None, env if env in ENVS else None)


def _env(r: Reader, got: Mapping[str, Any]) -> str | None:
    return r.choice("env", r.get("env", _stack_parts(got["stack"])[1]), ENVS)


def _cloud(r: Reader, got: Mapping[str, Any]) -> str | None:
    stack = got["stack"]
    stack_cloud = _stack_parts(stack)[0]
    cloud = r.choice("cloud", r.get("cloud", stack_cloud), CLOUDS)
    if cloud and stack_cloud and cloud != stack_cloud:
        r.fail(
            "cloud", cloud, f"{stack_cloud!r} (stacks are named <cloud>-<env>; this is {stack!r})"
        )
    return cloud


def _region(r: Reader, got: Mapping[str, Any]) -> str | None:
    cloud, region = got["cloud"], r.get("region")
    if not isinstance(region, str) or not _REGION_RE[cloud].match(region):
        r.fail(
            "region",
            region,
            f"a region id of {cloud} such as {'us-east-1' if cloud == 'aws' else 'cn-hangzhou'}",
        )
        return None
    return region


def _zones(r: Reader, got: Mapping[str, Any]) -> tuple[str, ...]:
    cloud, region = got["cloud"], got["region"]
    zones = r.structured("zones", list)
    if not zones:
        r.fail("zones", zones, "a non-empty list of zones in the region")
        return ()
    out = []
    for z in zones:
        ok = (
            isinstance(z, str)
            and region is not None
            and (
                re.match(rf"^{re.escape(region)}[a-z]$", z)
                if cloud == "aws"
                else re.match(rf"^{re.escape(region)}-[a-z]$", z)
            )
        )
        if not ok:
            example = f"{region}a" if cloud == "aws" else f"{region}-h"
            r.fail("zones", z, f"a zone of region {region!r} such as {example!r}")
        else:
            out.append(z)
    if len(set(out)) != len(out):
        r.fail("zones", zones, "distinct zones")
    if len(zones) > MAX_ZONES:
        r.fail(
            "zones",
            zones,
            f"at most {MAX_ZONES} zones (the address plan gives each zone "
            f"1/{BLOCKS} of vpc_cidr and keeps the last block for the services subnet)",
        )
        return tuple(out[:MAX_ZONES])
    return tuple(out)


def _mode(r: Reader, got: Mapping[str, Any]) -> str | None:
    return r.choice("mode", r.get("mode", "group" if got["env"] == "prod" else "instances"), MODES)


def _instance_type(r: Reader, got: Mapping[str, Any]) -> InstanceType | None:
    cloud = got["cloud"]
    name, gpu = r.get("instance_type"), r.structured("gpu", dict)
    if name is not None and gpu is not None:
        r.fail("gpu", gpu, "either instance_type or gpu, not both")
        return None
    if name is not None:
        found = catalog.lookup(cloud, name)
        if found is None:
            r.fail(
                "instance_type",
                name,
                f"a GPU type of the {cloud} catalog: " + ", ".join(catalog.instance_types(cloud)),
            )
        return found
    if gpu is None:
        r.fail(
            "instance_type",
            None,
            "an instance type, or `gpu: {model, count}` to pick the "
            "cheapest type carrying those GPUs",
        )
        return None
    model = gpu.get("model")
    count = r.number("gpu.count", gpu.get("count", 1), int, 1, 16, "an integer 1..16")
    if model not in catalog.gpu_models(cloud):
        r.fail(
            "gpu.model",
            model,
            f"a GPU model offered on {cloud}: " + ", ".join(catalog.gpu_models(cloud)),
        )
        return None
    if count is None:
        return None
    matches = catalog.by_gpu(cloud, model, count)
    if not matches:
        counts = sorted(
            {t.gpu_count for t in catalog.instance_types(cloud).values() if t.gpu_model == model}
        )
        r.fail("gpu.count", count, f"a count {cloud} offers for {model}: {counts}")
        return None
    return matches[0]


def _warm_pool(r: Reader, got: Mapping[str, Any]) -> WarmPool | None:
    raw = r.structured("warm_pool", dict)
    if raw is None:
        return None
    sub, bad = r.block("warm_pool", raw, got)
    if not sub.pop("enabled"):
        return None
    if got["cloud"] != "aws" or got["mode"] != "group":
        r.fail(
            "warm_pool",
            raw,
            "unset except on aws in mode: group (an Auto Scaling warm pool; "
            "ESS has no equivalent that keeps configured nodes stopped)",
        )
        return None
    return None if bad else WarmPool(**sub)


def _instance_types(r: Reader, got: Mapping[str, Any]) -> tuple[InstanceType, ...]:
    cloud, base, mode = got["cloud"], got["instance_type"], got["mode"]
    single = got["warm_pool"] is not None
    if base is None:
        return ()
    extra = r.structured("extra_instance_types", list)
    if extra is None:
        return tuple(catalog.same_class(base)) if mode in POOL_MODES and not single else (base,)
    if mode not in POOL_MODES:
        r.fail(
            "extra_instance_types",
            extra,
            "only in mode: group | kubernetes (instances mode uses one type)",
        )
        return (base,)
    if single:
        r.fail(
            "extra_instance_types",
            extra,
            "unset with warm_pool (AWS warm pools refuse "
            "groups with a mixed instances policy: the group launches one type)",
        )
        return (base,)
    out = [base]
    for name in extra:
        found = catalog.lookup(cloud, name)
        if found is None:
            r.fail(
                "extra_instance_types",
                name,
                "types of the catalog: " + ", ".join(catalog.instance_types(cloud)),
            )
        elif (found.gpu_model, found.gpu_count) != (base.gpu_model, base.gpu_count):
            r.fail(
                "extra_instance_types",
                name,
                f"types with the same GPUs as {base.name} ({base.gpu_count}x {base.gpu_model})"
                " so every node serves the same model the same way",
            )
        elif found not in out:
            out.append(found)
    return tuple(out)


def _nodes(r: Reader, got: Mapping[str, Any]) -> Nodes | None:
    raw = r.structured("nodes", dict) or {}
    sub, bad = r.block("nodes", raw, got)
    if bad:
        return None
    nodes = Nodes(**sub)
    if got["mode"] in POOL_MODES and not nodes.min <= nodes.desired <= nodes.max:
        r.fail(
            "nodes",
            raw,
            f"min <= desired <= max (got {nodes.min} <= {nodes.desired} <= {nodes.max})",
        )
    return nodes


def _spot(r: Reader, got: Mapping[str, Any]) -> Spot | None:
    raw = r.structured("spot", dict) or {}
    sub, bad = r.block("spot", raw, got)
    if bad:
        return None
    spot = Spot(**sub)
    if (
        got["mode"] == "instances"
        and spot.enabled
        and (spot.on_demand_base or spot.on_demand_percentage)
    ):
        r.fail(
            "spot.on_demand_base",
            spot.on_demand_base,
            "0 in mode: instances (every node is spot when "
            "spot.enabled; use mode: group for an on-demand base)",
        )
    return spot


def _scaling(r: Reader, got: Mapping[str, Any]) -> Scaling | None:
    raw = r.structured("scaling", dict)
    if got["mode"] != "group":
        if raw is not None:
            r.fail("scaling", raw, "unset in mode: instances (only a group scales on load)")
        return None
    sub, bad = r.block("scaling", raw or {}, got)
    return None if bad else Scaling(**sub)


GPU = Key(
    "mapping",
    "pick the cheapest type carrying these GPUs (instead of instance_type)",
    "{model: a GPU model of the cloud, count: 1..16}",
    subkeys=("model", "count"),
    name="gpu",
)


@dataclass(frozen=True, kw_only=True)
class Fleet:
    env: str = key(
        "string",
        "the environment",
        " | ".join(ENVS),
        derived="the stack name's <env>",
        parse=_env,
    )
    cloud: str = key(
        "string",
        "the cloud",
        " | ".join(CLOUDS),
        derived="the stack name's <cloud>",
        parse=_cloud,
        fatal=True,
    )
    region: str = key(
        "string",
        "the region id",
        "a region of the cloud (us-east-1, cn-hangzhou)",
        REQUIRED,
        parse=_region,
    )
    zones: tuple[str, ...] = key(
        "list",
        "zones the nodes spread over",
        f"1..{MAX_ZONES} distinct zones of the region",
        REQUIRED,
        parse=_zones,
    )
    mode: str = key(
        "string",
        "instances (fixed nodes), group (a scaling group) or kubernetes",
        " | ".join(MODES),
        derived="group for prod, else instances",
        parse=_mode,
    )
    instance_type: InstanceType = key(
        "string",
        "the GPU instance type",
        "a type of infra/catalog.py (or set gpu instead)",
        parse=_instance_type,
        alternative=GPU,
    )
    warm_pool: WarmPool | None = key(
        "mapping",
        "a pool of stopped, prepared nodes (AWS group mode)",
        "",
        record=WarmPool,
        switch=switch("false: no warm pool", True),
        parse=_warm_pool,
    )
    # the primary first; more only in group mode
    instance_types: tuple[InstanceType, ...] = key(
        "list",
        "more types with the same GPUs for a group's pool",
        "instance types of the catalog",
        name="extra_instance_types",
        parse=_instance_types,
    )
    nodes: Nodes = key(
        "mapping",
        "how many nodes (count: instances mode; min/max/desired: group)",
        "",
        record=Nodes,
        parse=_nodes,
    )
    spot: Spot = key(
        "mapping",
        "spot capacity and its price cap",
        "",
        record=Spot,
        parse=_spot,
    )
    scaling: Scaling | None = key(  # group mode only
        "mapping",
        "the group's scaling targets",
        "",
        record=Scaling,
        parse=_scaling,
    )
