"""What a cloud's price API answered for one region (Quote), and its error (PricingError): the
backends (infra.pricing.aws, infra.pricing.alicloud) return them, infra.pricing resolves them
into a PriceBook."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class PricingError(Exception):
    """A cloud's price API did not answer as needed (the message says which call and why)."""


def one_currency(currencies: set[str], api: str) -> str:
    """The one currency an API answered in (PricingError when it used several)."""
    if len(currencies) != 1:
        raise PricingError(f"{api} answered in {sorted(currencies)}, not one currency")
    return next(iter(currencies))


@dataclass(frozen=True)
class Quote:
    """What a cloud's price APIs said for one region."""

    currency: str
    on_demand: Mapping[str, float]  # type -> per hour
    spot: Mapping[str, float]  # type -> recent spot price per hour (mean over the zones)
    fees: Mapping[str, float]  # catalog.FEES key -> amount
    source: str  # the APIs asked
    fetched: str  # ISO 8601 UTC
