"""The fleet section: which cloud, where, how many nodes of which GPU type, bought how.

Each key is one field of `Fleet` (infra/config/keys.py says how a key is declared); the
parsers above it read the raw values. The nodes' own records (Nodes, Spot, Scaling, WarmPool)
are here too: their fields are the sub-keys of the blocks that set them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infra import catalog
from infra.addressing import BLOCKS, MAX_ZONES
from infra.catalog import InstanceType
from infra.config.keys import REQUIRED, Key, key, subkeys_of
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


@dataclass(frozen=True)
class Nodes:
    count: int  # instances mode
    min: int  # group mode
    max: int
    desired: int


@dataclass(frozen=True)
class Spot:
    enabled: bool
    max_price_ratio: float
    on_demand_base: int
    on_demand_percentage: int
    interruption: str
    on_demand_prices: Mapping[str, float] = field(default_factory=dict)
    fallback: str = "on_demand"  # SPOT_FALLBACKS


@dataclass(frozen=True)
class Scaling:
    """Scaling on load (group mode): the per-node targets the policies track."""

    requests_per_node: float  # requests per node per minute (ALBRequestCountPerTarget's unit)
    queue_depth_per_node: float | None  # None: derived from the request target (infra.lifecycle)
    gpu_utilization_percent: float  # the mean GPU utilisation per node the GPU policy holds
    scale_in: bool  # False: the load policies only ever add nodes
    protect_from_scale_in: bool  # new nodes are protected; only schedules/operators remove them
    launch_timeout_s: int  # the launching hook's heartbeat timeout


@dataclass(frozen=True)
class WarmPool:
    min_size: int
    max_prepared: int | None  # None: AWS keeps max_size - desired warm


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
    enabled = r.boolean("warm_pool.enabled", raw.get("enabled", True))
    if not enabled:
        return None
    if got["cloud"] != "aws" or got["mode"] != "group":
        r.fail(
            "warm_pool",
            raw,
            "unset except on aws in mode: group (an Auto Scaling warm pool; "
            "ESS has no equivalent that keeps configured nodes stopped)",
        )
        return None
    lo = r.number("warm_pool.min_size", raw.get("min_size", 0), int, 0, 100, "an integer 0..100")
    hi = raw.get("max_prepared")
    if hi is not None:
        hi = r.number(
            "warm_pool.max_prepared",
            hi,
            int,
            1,
            100,
            "an integer 1..100: nodes in the group and the pool together",
        )
    if lo is None or (raw.get("max_prepared") is not None and hi is None):
        return None
    return WarmPool(min_size=lo, max_prepared=hi)


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
    count = r.number("nodes.count", raw.get("count", 1), int, 1, 20, "an integer 1..20")
    lo = r.number("nodes.min", raw.get("min", 1), int, 0, 100, "an integer 0..100")
    hi = r.number("nodes.max", raw.get("max", max(lo or 1, 2)), int, 1, 100, "an integer 1..100")
    desired = r.number(
        "nodes.desired", raw.get("desired", lo or 1), int, 0, 100, "an integer 0..100"
    )
    if None in (count, lo, hi, desired):
        return None
    if got["mode"] in POOL_MODES and not lo <= desired <= hi:
        r.fail("nodes", raw, f"min <= desired <= max (got {lo} <= {desired} <= {hi})")
    return Nodes(count=count, min=lo, max=hi, desired=desired)


def _spot(r: Reader, got: Mapping[str, Any]) -> Spot | None:
    cloud, mode = got["cloud"], got["mode"]
    raw = r.structured("spot", dict) or {}
    enabled = r.boolean("spot.enabled", raw.get("enabled", False))
    ratio = r.number(
        "spot.max_price_ratio",
        raw.get("max_price_ratio", 1.0),
        float,
        None,
        MAX_PRICE_RATIO,
        f"a number > 0 and <= {MAX_PRICE_RATIO} (the cap is this ratio x on-demand)",
    )
    if ratio is not None and ratio <= 0:
        r.fail(
            "spot.max_price_ratio",
            ratio,
            f"a number > 0 and <= {MAX_PRICE_RATIO} (the cap is this ratio x on-demand)",
        )
        ratio = None
    base = r.number(
        "spot.on_demand_base",
        raw.get("on_demand_base", 0),
        int,
        0,
        100,
        "an integer 0..100 (on-demand nodes before any spot)",
    )
    pct = r.number(
        "spot.on_demand_percentage",
        raw.get("on_demand_percentage", 0),
        int,
        0,
        100,
        "an integer percentage 0..100 of on-demand above the base",
    )
    interruption = r.choice(
        "spot.interruption", raw.get("interruption", "terminate"), INTERRUPTION[cloud]
    )
    prices = raw.get("on_demand_prices", {})
    if not isinstance(prices, dict):
        r.fail(
            "spot.on_demand_prices",
            prices,
            "a map of instance type -> price per hour in the account's currency",
        )
        prices = {}
    for name, price in prices.items():
        if catalog.lookup(cloud, name) is None:
            r.fail("spot.on_demand_prices", name, "instance types of the catalog")
        r.number(f"spot.on_demand_prices.{name}", price, float, 0.0001, None, "a price > 0")
    fallback = r.choice("spot.fallback", raw.get("fallback", "on_demand"), SPOT_FALLBACKS)
    if (
        enabled is None
        or ratio is None
        or base is None
        or pct is None
        or interruption is None
        or fallback is None
    ):
        return None
    if mode == "instances" and (base or pct) and enabled:
        r.fail(
            "spot.on_demand_base",
            base,
            "0 in mode: instances (every node is spot when "
            "spot.enabled; use mode: group for an on-demand base)",
        )
    return Spot(
        enabled=enabled,
        max_price_ratio=ratio,
        on_demand_base=base,
        on_demand_percentage=pct,
        interruption=interruption,
        on_demand_prices={k: float(v) for k, v in prices.items()},
        fallback=fallback,
    )


def _scaling(r: Reader, got: Mapping[str, Any]) -> Scaling | None:
    raw = r.structured("scaling", dict)
    if got["mode"] != "group":
        if raw is not None:
            r.fail("scaling", raw, "unset in mode: instances (only a group scales on load)")
        return None
    raw = raw or {}
    what = (
        "requests per node per minute the request policy holds the group at (> 0): 0.7 x "
        "the sustained req/s `torchfleet-bench load URL` measures on one node, x 60"
    )
    requests = raw.get("requests_per_node")
    if requests is None:
        r.fail("scaling.requests_per_node", None, what)
    else:
        requests = r.number("scaling.requests_per_node", requests, float, 0.001, 1e7, what)
    queue = raw.get("queue_depth_per_node")
    if queue is not None:
        queue = r.number(
            "scaling.queue_depth_per_node",
            queue,
            float,
            0.01,
            1e5,
            "a number > 0 of requests waiting per node (Average over the group)",
        )
    lo, hi = GPU_TARGET_RANGE
    gpu = r.number(
        "scaling.gpu_utilization_percent",
        raw.get("gpu_utilization_percent", GPU_TARGET_DEFAULT),
        float,
        lo,
        hi,
        f"a number in {lo}..{hi}: the mean GPU utilisation per node the GPU policy holds",
    )
    scale_in = r.boolean("scaling.scale_in", raw.get("scale_in", True))
    protect = r.boolean("scaling.protect_from_scale_in", raw.get("protect_from_scale_in", False))
    lo, hi = LAUNCH_TIMEOUT_RANGE
    timeout = r.number(
        "scaling.launch_timeout_s",
        raw.get("launch_timeout_s", LAUNCH_TIMEOUT_DEFAULT_S),
        int,
        lo,
        hi,
        f"an integer number of seconds in {lo}..{hi} (the launching "
        "lifecycle hook's heartbeat timeout; AWS allows at most 7200)",
    )
    if requests is None or gpu is None or scale_in is None or protect is None or timeout is None:
        return None
    return Scaling(
        requests_per_node=requests,
        queue_depth_per_node=queue,
        gpu_utilization_percent=gpu,
        scale_in=scale_in,
        protect_from_scale_in=protect,
        launch_timeout_s=timeout,
    )


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
        "enabled, min_size 0..100, max_prepared 1..100",
        subkeys=subkeys_of(WarmPool, "enabled"),
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
        "integers (count 1..20, min/max/desired 0..100)",
        subkeys=subkeys_of(Nodes),
        parse=_nodes,
    )
    spot: Spot = key(
        "mapping",
        "spot capacity and its price cap",
        f"enabled, max_price_ratio <= {MAX_PRICE_RATIO} x on-demand, on-demand base and "
        "percentage, interruption behaviour, on_demand_prices (per hour, the account's "
        f"currency), fallback {' | '.join(SPOT_FALLBACKS)}",
        subkeys=subkeys_of(Spot),
        parse=_spot,
    )
    scaling: Scaling | None = key(  # group mode only
        "mapping",
        "the group's scaling targets",
        "per-node requests and queue depth, gpu_utilization_percent "
        f"{GPU_TARGET_RANGE[0]}..{GPU_TARGET_RANGE[1]}, "
        "scale_in, protect_from_scale_in, launch_timeout_s "
        f"{LAUNCH_TIMEOUT_RANGE[0]}..{LAUNCH_TIMEOUT_RANGE[1]}",
        subkeys=subkeys_of(Scaling),
        parse=_scaling,
    )
