"""GPU node pools of a cluster and their sizes, as the teardown schedules need them.

`split(cfg)` is the capacity rule of clouds whose pools are single-purchase-option (EKS managed
node groups: one capacity type each): an on-demand pool holding `spot.on_demand_base` nodes
(and able to grow to nodes.max as the autoscaler's fallback when spot is short) and a spot pool
above it. A cloud whose pool mixes both (ACK) uses `nodes` as is.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from infra.config import StackConfig


@dataclass(frozen=True)
class PoolSize:
    name: str  # "gpu-od" | "gpu-spot" | "gpu"
    spot: bool
    min: int
    max: int
    desired: int


@dataclass(frozen=True)
class ScaledPool:
    """A pool the working-hours schedule and the TTL resize (to its sizes, and to zero)."""

    name: str
    group_name: pulumi.Output[str]  # the cloud's scaling group (ASG name / ESS group id)
    min: int
    max: int
    desired: int


def split(cfg: StackConfig) -> list[PoolSize]:
    n = cfg.nodes
    if not cfg.spot.enabled:
        return [PoolSize("gpu-od", False, n.min, n.max, n.desired)]
    base = cfg.spot.on_demand_base
    pools = [PoolSize("gpu-od", False, base, n.max, base)]
    if n.max > base:
        pools.append(
            PoolSize("gpu-spot", True, max(n.min - base, 0), n.max - base, max(n.desired - base, 0))
        )
    return pools
