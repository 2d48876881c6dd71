"""The record of a stack: `StackConfig`, the sections' fields together (each declared once, in
its section: infra/config/fleet.py, image.py, network.py, operations.py, kubernetes.py,
rollout.py), the stack's name and what the program adds after load (the region's prices, a spot
fallback), and the figures derived from them (physical names, prices, spot caps)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from torchfleet_compat import matrix as compat

from infra import catalog, pricing
from infra.catalog import InstanceType
from infra.config.fleet import Fleet
from infra.config.image import Image
from infra.config.kubernetes import Kubernetes
from infra.config.network import Network
from infra.config.operations import Operations
from infra.config.reader import NAMESPACE
from infra.config.rollout import Rollout
from infra.matrix import load_matrix
from infra.pricing import PriceBook

# The sections in the stack file's order: the docs' table and the loader's pass follow it.
SECTIONS: tuple[type, ...] = (Fleet, Image, Network, Operations, Kubernetes, Rollout)


# A dataclass collects fields from its bases last base first: the bases below are SECTIONS
# reversed, so the record's fields are in the same order. Every field is keyword-only.
@dataclass(frozen=True, kw_only=True)
class StackConfig(Rollout, Kubernetes, Operations, Network, Image, Fleet):
    stack: str
    # The prices every estimate and spot cap uses (infra.pricing); None: the reference table.
    # load() never asks a cloud; the program resolves the region's own (with_prices).
    prices: PriceBook | None = None
    # Instances mode: why this run's nodes are on-demand although spot is enabled (`up` retries
    # with spot.fallback: on_demand after a spot capacity error; infra.deploy.capacity).
    fallback_reason: str = ""

    @property
    def bootstrap_mode(self) -> str:
        """The node's bootstrap mode (infra.bootstrap.BootstrapSpec.mode) for this boot path."""
        return "cold" if self.boot == "cold" else "baked"

    @property
    def name(self) -> str:
        """Prefix for physical names: the project and the stack."""
        return f"torchfleet-{self.stack}"

    @property
    def market(self) -> str:
        """`spot` or `on-demand`: what instances mode buys in this run (a group's split is its
        instances distribution)."""
        return "spot" if self.spot.enabled and not self.fallback_reason else "on-demand"

    @property
    def book(self) -> PriceBook:
        return self.prices or pricing.reference(self.cloud, self.region)

    @property
    def currency(self) -> str:
        """The currency of every price, cap and estimate of this stack (the account's, when the
        region's own prices were read)."""
        return self.book.currency

    def on_demand_price(self, itype: InstanceType | catalog.HostType) -> float:
        """`spot.on_demand_prices` where set, else the book's price."""
        return float(
            self.spot.on_demand_prices.get(itype.name, self.book.on_demand_price(itype.name))
        )

    def typical_spot_price(self, itype: InstanceType) -> float:
        """The region's recent spot price where it was read, else on-demand x the family's
        long-run ratio (the estimate's "typical" column; never a cap)."""
        recent = self.book.spot.get(itype.name)
        return (
            recent if recent is not None else self.on_demand_price(itype) * itype.typical_spot_ratio
        )

    def spot_cap(self, itype: InstanceType) -> float:
        """The most we bid for `itype`: ratio x the region's on-demand price in the account's
        currency, rounded DOWN (Alibaba takes three decimals, AWS four) so the cap never exceeds
        the ratio."""
        scale = 1000 if self.cloud == "alicloud" else 10000
        return math.floor(self.on_demand_price(itype) * self.spot.max_price_ratio * scale) / scale

    def with_prices(self, book: PriceBook) -> StackConfig:
        return replace(self, prices=book)

    def with_fallback(self, reason: str) -> StackConfig:
        """Instances mode with spot.fallback: on_demand after spot could not be had."""
        assert self.mode == "instances" and self.spot.enabled and self.spot.fallback == "on_demand"
        return replace(self, fallback_reason=reason)


def distro_warning(cfg: StackConfig, today: str) -> str | None:
    """The node distro past its standard support on `today` (the matrix's rule), or None. Mode
    kubernetes names no node distro: its nodes run the runtime image."""
    if cfg.mode == "kubernetes":
        return None
    verdict = compat.support_verdict(load_matrix(), cfg.image_distro, today)
    if verdict.ok:
        return None
    return (
        f"{NAMESPACE}:image_distro = {cfg.image_distro}: {verdict.reason}; supported: "
        f"{', '.join(verdict.distros) or 'none'} (a profile whose Python they run may be needed: "
        "compat/matrix.yml)"
    )
