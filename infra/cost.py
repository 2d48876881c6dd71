"""Cost estimate of a stack from the catalog: per hour and per month, on-demand vs spot, with
and without the working-hours schedule, at the steady size and (groups) at the scaling bounds,
plus a warm pool's stopped volumes and the monitoring host. Pure arithmetic on reference prices
(see catalog).

Every total includes the monitoring host (instance + its NAT gateway, all hours of the month,
plus its disk; traffic not priced); `monitoring_*` shows that share on its own."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from infra.catalog import (
    DISK_USD_PER_GB_MONTH,
    EBS_GP3_USD_PER_GB_MONTH,
    NAT_USD_PER_HOUR,
    PRICE_SOURCES,
)
from infra.config import StackConfig

HOURS_PER_MONTH = 730.0  # 365 * 24 / 12
WEEKS_PER_MONTH = 365.0 / 7 / 12


@dataclass(frozen=True)
class CostEstimate:
    instance_type: str
    nodes: int
    on_demand_nodes: int
    spot_nodes: int
    on_demand_usd_per_hour: float  # every node on-demand
    spot_cap_usd_per_hour: float  # spot nodes at their cap: the worst case we allow
    spot_typical_usd_per_hour: float  # spot nodes at the family's typical spot price
    hours_per_month: float  # 730, or the schedule's running hours
    monthly_on_demand_24x7_usd: float
    monthly_worst_case_usd: float  # schedule applied, spot at the cap
    monthly_typical_usd: float  # schedule applied, typical spot prices
    price_source: str
    # The scaling bounds (instances mode: both are the node count), worst case (spot at cap).
    min_nodes: int = 0
    max_nodes: int = 0
    spot_cap_usd_per_hour_at_min: float = 0.0
    spot_cap_usd_per_hour_at_max: float = 0.0
    monthly_worst_at_min_usd: float = 0.0
    monthly_worst_at_max_usd: float = 0.0
    warm_pool_usd_per_month: float = 0.0  # stopped instances' root volumes, largest pool
    monitoring_instance_type: str = ""  # empty: no monitoring host
    monitoring_usd_per_hour: float = 0.0  # instance + NAT gateway, in every total above
    monitoring_usd_per_month: float = 0.0  # 730 h of that + its disk

    def as_dict(self) -> dict:
        return asdict(self)


def split_nodes(cfg: StackConfig, size: int | None = None) -> tuple[int, int, int]:
    """(nodes, on-demand, spot) at `size` (default: the steady size): instances mode runs
    `nodes.count`, a group runs `nodes.desired` split like the group's instances distribution."""
    if cfg.mode == "instances":
        total = cfg.nodes.count
        return (total, 0, total) if cfg.spot.enabled else (total, total, 0)
    total = cfg.nodes.desired if size is None else size
    if not cfg.spot.enabled:
        return total, total, 0
    base = min(total, cfg.spot.on_demand_base)
    above = total - base
    on_demand = base + math.ceil(above * cfg.spot.on_demand_percentage / 100)
    return total, on_demand, total - on_demand


def bounds(cfg: StackConfig) -> tuple[int, int]:
    return (
        (cfg.nodes.count, cfg.nodes.count)
        if cfg.mode == "instances"
        else (cfg.nodes.min, cfg.nodes.max)
    )


def warm_pool_size(cfg: StackConfig) -> int:
    """The most stopped nodes the pool holds: with the group at its minimum, AWS keeps
    (max_prepared or max_size) - group size warm, and never fewer than min_size."""
    if cfg.warm_pool is None:
        return 0
    prepared = cfg.warm_pool.max_prepared or cfg.nodes.max
    return max(cfg.warm_pool.min_size, prepared - cfg.nodes.min)


def monitoring_cost(cfg: StackConfig) -> tuple[float, float]:
    """(USD/hour, USD/month) of the monitoring host: no schedule stops it."""
    if cfg.monitoring is None:
        return 0.0, 0.0
    hourly = cfg.monitoring.instance_type.usd_per_hour + NAT_USD_PER_HOUR[cfg.cloud]
    return hourly, hourly * HOURS_PER_MONTH + cfg.monitoring.disk_gb * DISK_USD_PER_GB_MONTH[
        cfg.cloud
    ]


def estimate(cfg: StackConfig) -> CostEstimate:
    itype = cfg.instance_type
    price = cfg.on_demand_price(itype)
    nodes, od, spot = split_nodes(cfg)
    hours = cfg.schedule.hours_per_week() * WEEKS_PER_MONTH if cfg.schedule else HOURS_PER_MONTH

    def worst(on_demand: int, spots: int) -> float:
        return on_demand * price + spots * cfg.spot_cap(itype)

    cap = worst(od, spot)
    typical = od * price + spot * price * itype.typical_spot_ratio
    lo, hi = bounds(cfg)
    at_min, at_max = worst(*split_nodes(cfg, lo)[1:]), worst(*split_nodes(cfg, hi)[1:])
    mon_h, mon_month = monitoring_cost(cfg)
    return CostEstimate(
        instance_type=itype.name,
        nodes=nodes,
        on_demand_nodes=od,
        spot_nodes=spot,
        on_demand_usd_per_hour=round(nodes * price + mon_h, 4),
        spot_cap_usd_per_hour=round(cap + mon_h, 4),
        spot_typical_usd_per_hour=round(typical + mon_h, 4),
        hours_per_month=round(hours, 1),
        monthly_on_demand_24x7_usd=round(nodes * price * HOURS_PER_MONTH + mon_month, 2),
        monthly_worst_case_usd=round(cap * hours + mon_month, 2),
        monthly_typical_usd=round(typical * hours + mon_month, 2),
        price_source=PRICE_SOURCES[cfg.cloud]
        + (
            "; overridden by spot.on_demand_prices"
            if itype.name in cfg.spot.on_demand_prices
            else ""
        ),
        min_nodes=lo,
        max_nodes=hi,
        spot_cap_usd_per_hour_at_min=round(at_min + mon_h, 4),
        spot_cap_usd_per_hour_at_max=round(at_max + mon_h, 4),
        monthly_worst_at_min_usd=round(at_min * hours + mon_month, 2),
        monthly_worst_at_max_usd=round(at_max * hours + mon_month, 2),
        warm_pool_usd_per_month=round(
            warm_pool_size(cfg) * cfg.disk_gb * EBS_GP3_USD_PER_GB_MONTH, 2
        ),
        monitoring_instance_type=cfg.monitoring.instance_type.name if cfg.monitoring else "",
        monitoring_usd_per_hour=round(mon_h, 4),
        monitoring_usd_per_month=round(mon_month, 2),
    )
