"""What a `mode: kubernetes` stack costs besides its GPU nodes at the steady size: the managed
control plane and the system nodes (fixed), and the GPU pool at its min and max.

The control plane and the system nodes run around the clock (a schedule and the TTL empty only
the GPU pool; the cluster bills until `pulumi destroy`); GPU nodes follow the schedule. Spot
nodes are priced at their cap (`StackConfig.spot_cap`), the worst case the stack allows. Every
figure is in the stack's currency, from its price book (infra.pricing; the control plane is the
`cluster_control_plane_per_hour` fee of compat/catalog.yml where no API gave it). infra/cost.py
lists the same fixed part, with the service's load balancer, in the stack's whole bill.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from infra.config import StackConfig
from infra.cost import HOURS_PER_MONTH, gpu_hours, system_node_price


@dataclass(frozen=True)
class ClusterCost:
    currency: str
    control_plane_per_hour: float
    system_nodes: int
    system_per_hour: float
    fixed_per_hour: float  # control plane + system nodes: paid whatever the GPU pool does
    gpu_nodes_min: int
    gpu_nodes_max: int
    gpu_min_per_hour: float  # the pool at nodes.min, spot at its cap
    gpu_max_per_hour: float  # the pool at nodes.max, spot at its cap
    gpu_hours_per_month: float  # 730, or the schedule's running hours
    monthly_fixed: float
    monthly_min: float  # fixed + the pool at min for its hours
    monthly_max: float  # fixed + the pool at max for its hours
    price_source: str

    def as_dict(self) -> dict:
        return asdict(self)


def gpu_pool_per_hour(cfg: StackConfig, nodes: int) -> float:
    """`nodes` GPU nodes: the on-demand base first, spot above it at the cap."""
    itype = cfg.instance_type
    on_demand = nodes if not cfg.spot.enabled else min(nodes, cfg.spot.on_demand_base)
    return on_demand * cfg.on_demand_price(itype) + (nodes - on_demand) * cfg.spot_cap(itype)


def cluster_cost(cfg: StackConfig) -> ClusterCost:
    k = cfg.kubernetes
    assert k is not None
    plane = cfg.book.fee("cluster_control_plane_per_hour") or 0.0
    system = k.system.count * system_node_price(cfg)
    fixed = plane + system
    hours = gpu_hours(cfg)
    lo, hi = gpu_pool_per_hour(cfg, cfg.nodes.min), gpu_pool_per_hour(cfg, cfg.nodes.max)
    return ClusterCost(
        currency=cfg.currency,
        control_plane_per_hour=plane,
        system_nodes=k.system.count,
        system_per_hour=round(system, 4),
        fixed_per_hour=round(fixed, 4),
        gpu_nodes_min=cfg.nodes.min,
        gpu_nodes_max=cfg.nodes.max,
        gpu_min_per_hour=round(lo, 4),
        gpu_max_per_hour=round(hi, 4),
        gpu_hours_per_month=round(hours, 1),
        monthly_fixed=round(fixed * HOURS_PER_MONTH, 2),
        monthly_min=round(fixed * HOURS_PER_MONTH + lo * hours, 2),
        monthly_max=round(fixed * HOURS_PER_MONTH + hi * hours, 2),
        price_source=cfg.book.describe(),
    )
