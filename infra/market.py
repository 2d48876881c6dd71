"""Market rules: the nodes' market (spot or on-demand) for one program run, and the cloud errors
that mean "no spot capacity now". A definition: the Pulumi program reads the market from it
(infra.program) and `up`'s spot fallback (infra.deploy.capacity) sets and detects it; it imports
neither.

`up` runs the program with MARKET_ENV set to the reason spot was left, or empty for spot; the
program buys on-demand only where that reason is set and the stack falls back (instances mode,
spot on, `spot.fallback: on_demand`)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from infra.config import StackConfig

# The program reads it (infra.program): the reason spot was left, empty or unset: spot.
MARKET_ENV = "TORCHFLEET_SPOT_FALLBACK"

# The providers' error codes for "no spot capacity at this price now" (not a quota or a typo).
CAPACITY_ERRORS = (
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
    "capacity-not-available",
    "OperationDenied.NoStock",
    "Zone.NotOnSale",
)


def capacity_code(text: str) -> str | None:
    """The capacity error code `text` (a failed update's message) reports, or None."""
    return next((code for code in CAPACITY_ERRORS if code in text), None)


def can_fall_back(cfg: StackConfig | None) -> bool:
    return (
        cfg is not None
        and cfg.mode == "instances"
        and cfg.spot.enabled
        and cfg.spot.fallback == "on_demand"
    )


def fallback_reason(cfg: StackConfig, env: Mapping[str, str] | None = None) -> str:
    """The reason this program run buys on-demand, or "" (spot, or not instances mode)."""
    reason = (os.environ if env is None else env).get(MARKET_ENV, "")
    return reason if reason and can_fall_back(cfg) else ""
