"""The prices a stack is estimated and capped with: its region's own, in the account's currency,
or the reference table's, and which of the two (with the date) in every output.

Contract:
- `PriceBook`: one currency; per instance type the on-demand price per hour and (live only) the
  recent spot price; the fees of the rest of the bill (infra.catalog.FEES). `origin` is `live`
  (read just now), `cache` (read earlier, `date` says when) or `reference` (compat/catalog.yml,
  its source and date); `describe()` is the line every output prints.
- `reference(cloud, region)`: the catalog as a book; `note` says why no region's own prices
  were used.
- `resolve(cloud, region, zones, types, mode)`: `offline` gives the reference; `auto` (what
  `plan` and `up` use) takes a cached quote younger than CACHE_MAX_AGE, else asks the cloud when
  this machine holds credentials (infra.credentials: never a metadata endpoint) with short
  timeouts and no retries (infra.pricing.aws / .alicloud), writes the answer to
  `.cache/prices/<cloud>-<region>.json` with its date, and on any failure falls back to an
  older cached quote, then to the reference, naming the failure. Nothing here raises for a
  cloud error: a plan must work offline.
- A live quote covers every type asked for (all or nothing: one currency); fees the cloud's
  price API does not give here stay the reference figures when the currency matches and are
  listed in `unpriced` when it does not (no exchange rate is guessed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from infra import catalog
from infra.matrix import REPO_ROOT

# What a backend answers (infra.pricing.aws / .alicloud import it from infra.pricing.quote: this
# package imports its backends, never the reverse).
from infra.pricing.quote import PricingError, Quote

MODES = ("auto", "offline")
CACHE_DIR = REPO_ROOT / ".cache" / "prices"
CACHE_MAX_AGE = timedelta(hours=24)
CACHE_FORMAT = 1
MODE_ENV = "TORCHFLEET_PRICES"  # auto | offline: what the program uses when not told


@dataclass(frozen=True)
class PriceBook:
    cloud: str
    region: str  # where the figures are from (the reference: the catalog's region)
    currency: str
    origin: str  # live | cache | reference
    source: str
    date: str  # when read (YYYY-MM-DD[THH:MM]) or the reference figures' date
    on_demand: Mapping[str, float]
    spot: Mapping[str, float] = field(default_factory=dict)
    fees: Mapping[str, float] = field(default_factory=dict)
    unpriced: tuple[str, ...] = ()  # fees without a figure in `currency`
    note: str = ""  # why the reference is used (offline, no credentials, the API's error)

    def on_demand_price(self, name: str) -> float:
        if name not in self.on_demand:
            raise KeyError(f"{self.describe()} has no price for {name}")
        return self.on_demand[name]

    def fee(self, name: str) -> float | None:
        """The fee in `currency`, or None when it is not priced in it."""
        return self.fees.get(name)

    def describe(self) -> str:
        if self.origin == "reference":
            return f"reference table ({self.source})" + (f"; {self.note}" if self.note else "")
        when = "read" if self.origin == "live" else "cached"
        line = f"{self.region}'s own prices in {self.currency}, {when} {self.date} ({self.source})"
        if self.unpriced:
            line += f"; not priced in {self.currency}: {', '.join(self.unpriced)}"
        return line + (f"; {self.note}" if self.note else "")


def reference(cloud: str, region: str, note: str = "") -> PriceBook:
    cat = catalog.load()
    prices = cat.prices(cloud)
    on_demand = {n: t.price.amount for n, t in cat.instance_types[cloud].items()}
    on_demand.update({n: t.price.amount for n, t in cat.host_types[cloud].items()})
    regions = sorted({p.region for p in prices})
    if region not in regions and not note:
        note = f"the stack runs in {region}: its own prices differ"
    return PriceBook(
        cloud=cloud,
        region=", ".join(regions),
        currency=prices[0].currency,  # the loader admits one currency (catalog.CURRENCIES)
        origin="reference",
        source=catalog.PRICE_SOURCES[cloud],
        date=max(p.date for p in prices),
        on_demand=on_demand,
        fees={k: p.amount for k, p in cat.fees[cloud].items()},
        note=note,
    )


def book_from_quote(cloud: str, region: str, quote: Quote, origin: str) -> PriceBook:
    """A live or cached quote as a book: fees the quote lacks come from the reference table when
    it is in the quote's currency."""
    ref = reference(cloud, region)
    fees = dict(quote.fees)
    unpriced = []
    for name in catalog.FEES:
        if name in fees:
            continue
        if ref.currency == quote.currency:
            fees[name] = ref.fees[name]
        else:
            unpriced.append(name)
    return PriceBook(
        cloud=cloud,
        region=region,
        currency=quote.currency,
        origin=origin,
        source=quote.source
        + (f"; other fees: {ref.source}" if len(quote.fees) < len(fees) else ""),
        date=quote.fetched[:16].replace("T", " ") if origin == "cache" else quote.fetched[:10],
        on_demand=dict(quote.on_demand),
        spot=dict(quote.spot),
        fees=fees,
        unpriced=tuple(unpriced),
    )


# -- the cache ------------------------------------------------------------------------------


def cache_path(cloud: str, region: str, root: Path | None = None) -> Path:
    return (root or CACHE_DIR) / f"{cloud}-{region}.json"


def read_cache(cloud: str, region: str, root: Path | None = None) -> Quote | None:
    try:
        data = json.loads(cache_path(cloud, region, root).read_text())
        if data.get("format") != CACHE_FORMAT:
            return None
        return Quote(
            currency=str(data["currency"]),
            on_demand={str(k): float(v) for k, v in data["on_demand"].items()},
            spot={str(k): float(v) for k, v in data.get("spot", {}).items()},
            fees={str(k): float(v) for k, v in data.get("fees", {}).items()},
            source=str(data["source"]),
            fetched=str(data["fetched"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no cache, or one this version cannot read: ask again


def write_cache(cloud: str, region: str, quote: Quote, root: Path | None = None) -> Path:
    path = cache_path(cloud, region, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": CACHE_FORMAT, **quote.__dict__}
    for key in ("on_demand", "spot", "fees"):
        data[key] = dict(sorted(data[key].items()))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
    return path


def _age(quote: Quote, now: datetime) -> timedelta:
    return now - datetime.fromisoformat(quote.fetched.replace("Z", "+00:00"))


def _covers(quote: Quote | None, types: Iterable[str]) -> bool:
    return quote is not None and all(t in quote.on_demand for t in types)


# -- asking the cloud -----------------------------------------------------------------------


def _has_credentials(cloud: str, env: Mapping[str, str], home: Path) -> str | None:
    """None when this machine holds credentials for `cloud`, else why not."""
    from infra.credentials import CredentialsError, alicloud_keys, aws_credentials

    try:
        found = aws_credentials(env) if cloud == "aws" else alicloud_keys(env, home)
    except CredentialsError as err:
        return err.message
    return None if found is not None else f"no {cloud} credentials on this machine"


def ask(
    cloud: str, region: str, zones: tuple[str, ...], types: tuple[str, ...], now: datetime
) -> Quote:
    """The region's prices from the cloud (PricingError on any failure)."""
    if cloud == "aws":
        from infra.pricing import aws as backend
    else:
        from infra.pricing import alicloud as backend  # type: ignore[no-redef]
    return backend.quote(region, zones, types, now)


def resolve(
    cloud: str,
    region: str,
    zones: tuple[str, ...],
    types: Iterable[str],
    mode: str | None = None,
    *,
    now: datetime | None = None,
    cache_root: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> PriceBook:
    """The book for a stack (see the module docstring); never raises for a cloud's error."""
    from infra.schedule import deploy_time

    env = os.environ if env is None else env
    mode = mode or env.get(MODE_ENV) or "auto"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV} = {mode!r} is invalid; allowed: {' | '.join(MODES)}")
    if mode == "offline":
        return reference(cloud, region, "offline: no price API asked")
    wanted = tuple(sorted(set(types)))
    now = now or deploy_time()
    cached = read_cache(cloud, region, cache_root)
    if _covers(cached, wanted) and _age(cached, now) < CACHE_MAX_AGE:  # type: ignore[arg-type]
        return book_from_quote(cloud, region, cached, "cache")  # type: ignore[arg-type]
    home = Path(env.get("HOME") or Path.home())
    why = _has_credentials(cloud, env, home)
    if why is None:
        try:
            quote = ask(cloud, region, zones, wanted, now)
        except PricingError as err:
            why = f"the price API failed: {err}"
        else:
            if cached is not None and cached.currency == quote.currency:
                quote = replace(
                    quote,
                    on_demand={**cached.on_demand, **quote.on_demand},
                    spot={**cached.spot, **quote.spot},
                )
            write_cache(cloud, region, quote, cache_root)
            return book_from_quote(cloud, region, quote, "live")
    if _covers(cached, wanted):
        book = book_from_quote(cloud, region, cached, "cache")  # type: ignore[arg-type]
        return replace(book, note=f"older than {CACHE_MAX_AGE.days * 24} h: {why}")
    return reference(cloud, region, why)


def as_output(book: PriceBook) -> dict[str, Any]:
    """What the stack exports about its prices (the `prices` output)."""
    return {
        "currency": book.currency,
        "origin": book.origin,
        "region": book.region,
        "date": book.date,
        "source": book.describe(),
    }
