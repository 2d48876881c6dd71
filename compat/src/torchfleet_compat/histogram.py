"""Prometheus' histogram_quantile, as one rule for everything that reads the runtime's latency
histogram outside Prometheus: the runtime's `diagnose`, the rollout's figures from the nodes'
own /metrics (infra/rollout/signals.py) and the node agent's per-interval p99 for CloudMonitor
(infra/bootstrap/torchfleet_agent/metrics.py).

`LATENCY_BOUNDS`: the upper bounds of the runtime's request-latency histogram
(`torchfleet_request_duration_seconds`), here so the runtime that writes it and the rollout that
reads it share them: from `FINE_FROM_S` to `FINE_TO_S` each bound is at most `FINE_RATIO` above
the one below (the p99 guard's default `max_p99_ratio`), so a reading can tell a change of that
ratio at any latency in that range; coarse below and above. `resolution(p, bounds)`: the
smallest ratio of two p99s that those bounds can tell apart at `p` (the upper bound of the
bucket holding `p` over its lower bound; infinite in the lowest bucket and past the highest
finite bound), to three decimals.

`quantile(q, buckets)`: buckets are cumulative counts by upper bound ({le: count}, or
(le, count) pairs); linear interpolation inside the bucket the rank falls in, the lowest bucket
from 0; in the +Inf bucket, the highest finite bound. None without observations.

Standard library only, Python 3.8 (the node's interpreter and the controller's)."""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Tuple, Union

Buckets = Union[Mapping[float, float], Iterable[Tuple[float, float]]]

FINE_FROM_S = 0.005
FINE_TO_S = 5.0
FINE_RATIO = 1.2
# One decade's bounds: each at most FINE_RATIO above the one before (and 10 over the last), with
# 1, 2 and 5 among them so the usual thresholds (an SLO of 200 ms, 5 ms, 1 s) are bounds.
_DECADE = (1.0, 1.2, 1.42, 1.68, 2.0, 2.4, 2.8, 3.3, 3.9, 4.5, 5.0, 6.0, 7.1, 8.4)


def _fine_bounds() -> tuple[float, ...]:
    out = []
    for exponent in range(-3, 1):
        for m in _DECADE:
            bound = round(m * 10.0**exponent, 6)
            if FINE_FROM_S <= bound <= FINE_TO_S:
                out.append(bound)
    return tuple(out)


LATENCY_BOUNDS: tuple[float, ...] = (0.001, 0.0025, *_fine_bounds(), 10.0)


def resolution(p: float, bounds: Iterable[float]) -> float:
    """The smallest ratio of two p99s the histogram's `bounds` can tell apart at `p` seconds."""
    lower = 0.0
    for bound in sorted(b for b in bounds if math.isfinite(b)):
        if p <= bound:
            return round(bound / lower, 3) if lower > 0 else math.inf
        lower = bound
    return math.inf


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
