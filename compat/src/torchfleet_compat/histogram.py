"""Prometheus' histogram_quantile, as one rule for everything that reads the runtime's latency
histogram outside Prometheus: the runtime's `diagnose`, the rollout's figures from the nodes'
own /metrics (infra/rollout/signals.py) and the node agent's per-interval p99 for CloudMonitor
(infra/bootstrap/torchfleet_agent/metrics.py).

`quantile(q, buckets)`: buckets are cumulative counts by upper bound ({le: count}, or
(le, count) pairs); linear interpolation inside the bucket the rank falls in, the lowest bucket
from 0; in the +Inf bucket, the highest finite bound. None without observations.

Standard library only, Python 3.8 (the node's interpreter and the controller's)."""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Tuple, Union

Buckets = Union[Mapping[float, float], Iterable[Tuple[float, float]]]


def quantile(q: float, buckets: Buckets) -> float | None:
    pairs = sorted(buckets.items() if isinstance(buckets, Mapping) else buckets)
    if not pairs or pairs[-1][1] <= 0:
        return None
    rank = q * pairs[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in pairs:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            width = count - lower_count
            return lower_bound + (bound - lower_bound) * (
                (rank - lower_count) / width if width else 1
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def growth(now: Mapping[float, float], before: Mapping[float, float]) -> dict:
    """The buckets of the observations between two scrapes of one histogram (cumulative counts
    by upper bound); a count that went down (the process restarted) counts from 0."""
    if any(now.get(le, 0.0) < c for le, c in before.items()):
        before = {}
    return {le: c - before.get(le, 0.0) for le, c in now.items()}
