"""Instances mode's spot fallback: what `up` does when the cloud has no spot capacity.

A spot instance that cannot be placed fails its `pulumi up` with the cloud's capacity error
(AWS: InsufficientInstanceCapacity, SpotMaxPriceTooLow, ...; Alibaba: OperationDenied.NoStock).
With `spot.fallback: on_demand` (the default) `up` runs the program once more with MARKET_ENV set
to the reason: the program then buys the nodes on-demand (StackConfig.with_fallback) and `up`
says so; with `spot.fallback: fail` the capacity error is the stage's error, with what to change.
Every `up` tries spot first: an on-demand node of an earlier fallback is replaced by a spot one
as soon as an `up` finds spot capacity again.

The market rules themselves (MARKET_ENV, the capacity error codes) are infra.market's. Groups
fall back inside the cloud (infra.aws.fallback; Alibaba's ESS compensate_with_on_demand),
not here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from infra.config import StackConfig
from infra.deploy.stage import StageError
from infra.market import MARKET_ENV as MARKET_ENV  # the tests read it here too
from infra.market import can_fall_back, capacity_code

T = TypeVar("T")


def capacity_error(err: StageError) -> str | None:
    """The capacity error code `err` reports, or None (any other failure)."""
    return capacity_code("\n".join([err.message, *err.details]))


def provision(
    cfg: StackConfig | None,
    up: Callable[[Mapping[str, str]], T],
    say: Callable[[str], None],
) -> T:
    """`up(env)` once with spot; after a spot capacity error, once more on-demand (or the error,
    with `spot.fallback: fail`). `say` tells the user which market the nodes are on and why."""
    if cfg is None or cfg.mode != "instances" or not cfg.spot.enabled:
        return up({MARKET_ENV: ""})  # on-demand already, or a group: its cloud falls back
    try:
        result = up({MARKET_ENV: ""})
    except StageError as err:
        code = capacity_error(err)
        if code is None:
            raise
        if not can_fall_back(cfg):
            err.fix = (
                f"no spot capacity for {cfg.instance_type.name} in {', '.join(cfg.zones)} "
                f"({code}): retry later, add zones, raise spot.max_price_ratio, or set "
                "spot.fallback: on_demand (spot.fallback is fail)"
            )
            raise
        reason = f"{code} for spot {cfg.instance_type.name} in {', '.join(cfg.zones)}"
        say(f"  spot could not be had ({reason}); spot.fallback: on_demand: the nodes on-demand")
        result = up({MARKET_ENV: reason})
        say(f"  nodes: on-demand (spot.fallback: on_demand after {code}); the next `up` tries spot")
        return result
    say(f"  nodes: spot (cap {cfg.spot_cap(cfg.instance_type):.4f} {cfg.book.currency}/h)")
    return result


def describe(cfg: StackConfig) -> str | None:
    """What happens to this stack when spot cannot be had (what `plan` prints), or None."""
    if not cfg.spot.enabled or cfg.mode == "kubernetes":
        return None  # kubernetes: the cluster autoscaler's on-demand pool (docs/kubernetes.md)
    if cfg.spot.fallback == "fail":
        return (
            "spot.fallback fail: the nodes stay short (instances: `up` stops) while spot is short"
        )
    if cfg.mode == "instances":
        return (
            "spot.fallback on_demand: after a spot capacity error `torchfleet up` runs once more "
            "with the nodes on-demand and says so; the next `up` tries spot again"
        )
    if cfg.cloud == "aws":
        from infra.aws import fallback
        from infra.nodeboot import fallback_group_name

        return (
            f"spot.fallback on_demand: {fallback_group_name(cfg)} (on-demand, 0 at rest) adds "
            f"the spot group's shortfall after {fallback.FILL_MINUTES} min and removes its "
            f"surplus after {fallback.RETURN_MINUTES} min of spot whole again"
        )
    return "spot.fallback on_demand: ESS compensates with pay-as-you-go nodes while spot is short"
