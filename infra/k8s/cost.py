"""What a `mode: kubernetes` stack costs besides its GPU nodes at the steady size (infra/cost.py
prices those): the managed control plane, the system nodes, and the GPU pool at its min and max.

The control plane and the system nodes run around the clock (a schedule and the TTL empty only
the GPU pool; the cluster bills until `pulumi destroy`); GPU nodes follow the schedule. Spot
nodes are priced at their cap (`StackConfig.spot_cap`), the worst case the stack allows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from infra.config import StackConfig
from infra.cost import HOURS_PER_MONTH, WEEKS_PER_MONTH

# Reference control-plane prices, per cluster-hour:
# - EKS: USD 0.10 in standard support (USD 0.60 in extended support, which the cluster's
#   upgrade policy STANDARD avoids); AWS "Amazon EKS pricing" and the AWS Containers blog on
#   extended-support pricing (effective 2024-04-01), unchanged as of 2026-03.
# - ACK Pro (ack.pro.small): USD 0.09 pay-as-you-go; Alibaba Cloud "Billing for ACK managed and
#   dedicated clusters" (last updated 2026-03-26); prices may vary by region. The API server's
#   CLB (instance fee + LCU) is billed on top and not included.
CONTROL_PLANE = {
    "aws": (0.10, "Amazon EKS pricing, standard support, 2026-03 (reference figure)"),
    "alicloud": (
        0.09,
        "Alibaba Cloud ACK Pro cluster management fee, 2026-03 (reference "
        "figure; API server CLB not included)",
    ),
}


@dataclass(frozen=True)
class ClusterCost:
    control_plane_usd_per_hour: float
    system_nodes: int
    system_usd_per_hour: float
    fixed_usd_per_hour: float  # control plane + system nodes: paid whatever the GPU pool does
    gpu_nodes_min: int
    gpu_nodes_max: int
    gpu_min_usd_per_hour: float  # the pool at nodes.min, spot at its cap
    gpu_max_usd_per_hour: float  # the pool at nodes.max, spot at its cap
    gpu_hours_per_month: float  # 730, or the schedule's running hours
    monthly_fixed_usd: float
    monthly_min_usd: float  # fixed + the pool at min for its hours
    monthly_max_usd: float  # fixed + the pool at max for its hours
    price_source: str

    def as_dict(self) -> dict:
        return asdict(self)


def gpu_pool_usd_per_hour(cfg: StackConfig, nodes: int) -> float:
    """`nodes` GPU nodes: the on-demand base first, spot above it at the cap."""
    itype = cfg.instance_type
    on_demand = nodes if not cfg.spot.enabled else min(nodes, cfg.spot.on_demand_base)
    return on_demand * cfg.on_demand_price(itype) + (nodes - on_demand) * cfg.spot_cap(itype)


def cluster_cost(cfg: StackConfig) -> ClusterCost:
    k = cfg.kubernetes
    assert k is not None
    plane, source = CONTROL_PLANE[cfg.cloud]
    system = k.system.count * k.system.usd_per_hour
    fixed = plane + system
    hours = cfg.schedule.hours_per_week() * WEEKS_PER_MONTH if cfg.schedule else HOURS_PER_MONTH
    lo, hi = gpu_pool_usd_per_hour(cfg, cfg.nodes.min), gpu_pool_usd_per_hour(cfg, cfg.nodes.max)
    return ClusterCost(
        control_plane_usd_per_hour=plane,
        system_nodes=k.system.count,
        system_usd_per_hour=round(system, 4),
        fixed_usd_per_hour=round(fixed, 4),
        gpu_nodes_min=cfg.nodes.min,
        gpu_nodes_max=cfg.nodes.max,
        gpu_min_usd_per_hour=round(lo, 4),
        gpu_max_usd_per_hour=round(hi, 4),
        gpu_hours_per_month=round(hours, 1),
        monthly_fixed_usd=round(fixed * HOURS_PER_MONTH, 2),
        monthly_min_usd=round(fixed * HOURS_PER_MONTH + lo * hours, 2),
        monthly_max_usd=round(fixed * HOURS_PER_MONTH + hi * hours, 2),
        price_source=source,
    )
