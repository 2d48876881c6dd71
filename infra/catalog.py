"""GPU instance types of both clouds, what each one holds and what it costs: the typed loader of
compat/catalog.yml and the lookups on it.

Contract: compat/catalog.yml is the data (with compat/matrix.yml, the only place that states
such facts); this module reads it once per process, checks the whole file in one pass and
refuses it with `CatalogError`, one line per problem, each naming the file, the key, the value
and what is allowed. GPU memory and compute capability are not repeated: they belong to the GPU
model and come from the matrix (`InstanceType.gpu`).

Every price is a `Price`: amount, currency, region, source and date, so an estimate can say where
its figures come from (`PRICE_SOURCES`) and a later source (a cloud's price API) can stand
beside these reference figures with its own region and date. Amounts are USD per hour (per
GB-month for disks): the estimates and spot caps add them up, so the loader refuses another
currency rather than mixing them.

The module-level names (CATALOG, HOST_TYPES, DEFAULT_HOST_TYPE, PRICE_SOURCES, NAT_USD_PER_HOUR,
DISK_USD_PER_GB_MONTH, EBS_GP3_USD_PER_GB_MONTH) are views of `load()`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from infra.matrix import REPO_ROOT, GpuModel, load_matrix

FORMAT = 1
CATALOG_FILE = REPO_ROOT / "compat" / "catalog.yml"
# The estimates and caps add amounts up: one currency until a conversion exists.
CURRENCIES = ("USD",)
FEES = ("nat_gateway_per_hour", "disk_per_gb_month")

_PRICE_FIELDS = ("currency", "region", "source", "date")
_FIELDS = {
    "file": ("format", "sources", "clouds"),
    "source": ("title", "note"),
    "cloud": ("default_host_type", "families", "instance_types", "host_types", "fees"),
    "family": ("typical_spot_ratio", "source", "date"),
    "instance_type": (
        *("type", "family", "gpu", "gpus", "vcpu", "ram_gib", "on_demand"),
        *_PRICE_FIELDS,
    ),
    "host_type": ("type", "vcpu", "ram_gib", "on_demand", *_PRICE_FIELDS),
    "fees": FEES,
    "fee": ("price", *_PRICE_FIELDS),
}
_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*$")  # cloud, family, source and type names
_REGION = re.compile(r"^[a-z]{2,}(-[a-z0-9]+)+$")  # us-east-1, ap-southeast-1, cn-hangzhou
_DATE = re.compile(r"^\d{4}(-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?)?$")


class CatalogError(ValueError):
    """The catalog file breaks the schema: every problem, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Source:
    key: str
    title: str
    note: str


@dataclass(frozen=True)
class Price:
    amount: float  # in `currency`, per hour (per GB-month for a disk)
    currency: str
    region: str
    source: Source
    date: str  # when it was read: YYYY, YYYY-MM or YYYY-MM-DD

    def describe(self) -> str:
        return (
            f"{self.source.title}, {self.region}, {self.currency}, {self.date} ({self.source.note})"
        )


@dataclass(frozen=True)
class HostType:
    """A general-purpose type for the stack's monitoring host (no GPU)."""

    cloud: str
    name: str
    vcpu: int
    ram_gib: float
    price: Price

    @property
    def usd_per_hour(self) -> float:
        return self.price.amount


@dataclass(frozen=True)
class InstanceType:
    cloud: str
    name: str
    family: str
    gpu_model: str
    gpu_count: int
    vcpu: int
    ram_gib: float
    price: Price
    typical_spot_ratio: float

    @property
    def usd_per_hour(self) -> float:
        return self.price.amount

    @property
    def gpu(self) -> GpuModel:
        return load_matrix().gpu(self.gpu_model)

    @property
    def compute_capability(self) -> str:
        return self.gpu.compute_capability

    @property
    def gpu_memory_gib(self) -> int:
        return self.gpu.memory_gib * self.gpu_count


@dataclass(frozen=True)
class Catalog:
    source: str  # the file it was read from
    sources: dict[str, Source]
    instance_types: dict[str, dict[str, InstanceType]]  # cloud -> type name -> type
    host_types: dict[str, dict[str, HostType]]
    default_host_type: dict[str, str]
    fees: dict[str, dict[str, Price]]  # cloud -> FEES key -> price

    def prices(self, cloud: str) -> list[Price]:
        return [
            *(t.price for t in self.instance_types[cloud].values()),
            *(t.price for t in self.host_types[cloud].values()),
            *self.fees[cloud].values(),
        ]


# -- reading ------------------------------------------------------------------------------------


class _Check:
    """Collects every problem of one file instead of stopping at the first."""

    def __init__(self, source: str):
        self.source = source
        self.problems: list[str] = []

    def fail(self, key: str, value: Any, allowed: str) -> None:
        self.problems.append(f"{self.source}: {key} = {value!r} is invalid; allowed: {allowed}")

    def fields(self, key: str, raw: Any, kind: str) -> Mapping[str, Any] | None:
        """`raw` when it is a mapping with exactly the fields of `kind` (else None)."""
        names = _FIELDS[kind]
        if not isinstance(raw, dict):
            self.fail(key or "(the file)", raw, "a mapping with the keys " + ", ".join(names))
            return None
        where = f"{key}." if key else ""
        for k in raw:
            if k not in names:
                self.fail(where + str(k), raw[k], "the keys " + ", ".join(names))
        missing = [k for k in names if k not in raw]
        for k in missing:
            self.fail(where + k, "(missing)", "a value: each entry has " + ", ".join(names))
        return None if missing else raw

    def value(
        self, key: str, raw: Any, ok: Callable[[Any], bool], allowed: str, hint: str = ""
    ) -> Any:
        if isinstance(raw, bool) or not ok(raw):
            self.fail(key, raw, allowed + hint)
            return None
        return raw

    def name(self, key: str, raw: Any, what: str) -> str | None:
        return self.value(key, raw, lambda v: isinstance(v, str) and bool(_NAME.match(v)), what)

    def count(self, key: str, raw: Any) -> int | None:
        return self.value(key, raw, lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")

    def amount(self, key: str, raw: Any) -> float | None:
        got = self.value(key, raw, lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0")
        return None if got is None else float(got)

    def choice(self, key: str, raw: Any, allowed: Mapping[str, Any] | tuple[str, ...]) -> Any:
        return self.value(
            key,
            raw,
            lambda v: isinstance(v, str) and v in allowed,
            " | ".join(allowed) or "(none is defined)",
        )

    def date(self, key: str, raw: Any) -> str | None:
        return self.value(
            key,
            raw,
            lambda v: isinstance(v, str) and bool(_DATE.match(v)),
            'a date "YYYY", "YYYY-MM" or "YYYY-MM-DD"',
            " in quotes (YAML reads an unquoted date as a date or a number)"
            if not isinstance(raw, str)
            else "",
        )


def _price(
    c: _Check, key: str, raw: Mapping[str, Any], amount_key: str, sources: Mapping[str, Source]
) -> Price | None:
    amount = c.amount(f"{key}.{amount_key}", raw[amount_key])
    currency = c.choice(f"{key}.currency", raw["currency"], CURRENCIES)
    region = c.value(
        f"{key}.region",
        raw["region"],
        lambda v: isinstance(v, str) and bool(_REGION.match(v)),
        "a region name such as us-east-1 or ap-southeast-1",
    )
    source = c.choice(f"{key}.source", raw["source"], tuple(sources))
    date = c.date(f"{key}.date", raw["date"])
    if amount is None or None in (currency, region, source, date):
        return None
    return Price(amount, currency, region, sources[source], date)


def _rows(c: _Check, key: str, raw: Any, kind: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(key of the row, the row) of a list section, each row named by its type where it has
    one; rows without exactly the fields of `kind` are reported and left out."""
    if not isinstance(raw, list) or not raw:
        c.fail(key, raw, "a non-empty list of mappings")
        return
    for i, row in enumerate(raw):
        name = row.get("type") if isinstance(row, dict) else None
        rkey = f"{key}[{i}]" + (f" ({name})" if isinstance(name, str) else "")
        checked = c.fields(rkey, row, kind)
        if checked is not None:
            yield rkey, checked


def _families(c: _Check, key: str, raw: Any, sources: Mapping[str, Source]) -> dict[str, float]:
    """family -> typical spot / on-demand ratio."""
    if not isinstance(raw, dict) or not raw:
        c.fail(key, raw, "a mapping of family name -> typical_spot_ratio, source, date")
        return {}
    ratios = {}
    for fam, fraw in raw.items():
        fkey = f"{key}.{fam}"
        c.name(fkey, fam, "a family name such as g5 or gn7i")
        fraw = c.fields(fkey, fraw, "family")
        if fraw is None:
            continue
        ratio = c.value(
            f"{fkey}.typical_spot_ratio",
            fraw["typical_spot_ratio"],
            lambda v: isinstance(v, (int, float)) and 0 < v <= 1,
            "a number in (0, 1]: spot price / on-demand price",
        )
        c.choice(f"{fkey}.source", fraw["source"], tuple(sources))
        c.date(f"{fkey}.date", fraw["date"])
        ratios[fam] = float(ratio or 0)
    return ratios


def _cloud(c: _Check, cloud: str, raw: Mapping[str, Any], cat: Catalog) -> None:
    """One cloud's section into `cat` (what is sound of it; the caller refuses a file with
    problems)."""
    key, sources = f"clouds.{cloud}", cat.sources
    ratios = _families(c, f"{key}.families", raw["families"], sources)
    gpus = load_matrix().gpus
    gpu_types: dict[str, InstanceType] = {}
    host_types: dict[str, HostType] = {}
    seen: set[str | None] = set()
    host_names: list[str] = []  # every host type named, for default_host_type's allowed list
    for section, kind in (("instance_types", "instance_type"), ("host_types", "host_type")):
        for rkey, row in _rows(c, f"{key}.{section}", raw[section], kind):
            name = c.name(f"{rkey}.type", row["type"], "an instance type name such as g5.xlarge")
            if name in seen:
                c.fail(f"{rkey}.type", name, f"a type not listed before in {key}")
            seen.add(name)
            vcpu = c.count(f"{rkey}.vcpu", row["vcpu"])
            ram = c.amount(f"{rkey}.ram_gib", row["ram_gib"])
            price = _price(c, rkey, row, "on_demand", sources)
            if kind == "host_type":
                host_names += [name] if name else []
                if name and vcpu and ram and price:
                    host_types[name] = HostType(cloud, name, vcpu, ram, price)
                continue
            family = c.choice(f"{rkey}.family", row["family"], tuple(ratios))
            gpu = c.choice(f"{rkey}.gpu", row["gpu"], tuple(gpus))
            count = c.count(f"{rkey}.gpus", row["gpus"])
            if name and vcpu and ram and price and family and gpu and count:
                gpu_types[name] = InstanceType(
                    cloud, name, family, gpu, count, vcpu, ram, price, ratios[family]
                )
    c.choice(f"{key}.default_host_type", raw["default_host_type"], tuple(host_names))
    fees: dict[str, Price] = {}
    for fee, fraw in (c.fields(f"{key}.fees", raw["fees"], "fees") or {}).items():
        fraw = c.fields(f"{key}.fees.{fee}", fraw, "fee")
        price = _price(c, f"{key}.fees.{fee}", fraw, "price", sources) if fraw else None
        if price:
            fees[fee] = price
    cat.instance_types[cloud] = gpu_types
    cat.host_types[cloud] = host_types
    cat.default_host_type[cloud] = raw["default_host_type"]
    cat.fees[cloud] = fees


def parse(data: Any, source: str = "compat/catalog.yml") -> Catalog:
    """The catalog of an already-parsed YAML document, or CatalogError with every problem."""
    c = _Check(source)
    top = c.fields("", data, "file")
    if top is None:
        raise CatalogError(c.problems)
    if top["format"] != FORMAT:
        c.fail("format", top["format"], f"{FORMAT} (what this loader reads)")
    cat = Catalog(source, {}, {}, {}, {}, {})
    if not isinstance(top["sources"], dict) or not top["sources"]:
        c.fail("sources", top["sources"], "a mapping of source name -> title, note")
    else:
        for name, raw in top["sources"].items():
            c.name(f"sources.{name}", name, "a source name such as aws-price-list")
            raw = c.fields(f"sources.{name}", raw, "source")
            if raw is None:
                continue
            title, note = (
                c.value(f"sources.{name}.{k}", raw[k], lambda v: isinstance(v, str) and v, "text")
                for k in ("title", "note")
            )
            cat.sources[name] = Source(name, title or "", note or "")
    clouds = top["clouds"]
    if not isinstance(clouds, dict) or not clouds:
        c.fail("clouds", clouds, "a mapping of cloud name -> its section")
        clouds = {}
    for cloud, raw in clouds.items():
        c.name(f"clouds.{cloud}", cloud, "a cloud name such as aws")
        raw = c.fields(f"clouds.{cloud}", raw, "cloud")
        if raw is not None:
            _cloud(c, cloud, raw, cat)
    if c.problems:
        raise CatalogError(c.problems)
    return cat


def read(path: str | Path) -> Catalog:
    """Parses and checks a catalog file (CatalogError names the file on every problem)."""
    try:
        # libyaml's loader where PyYAML has it: the pure-Python one takes ten times as long
        data = yaml.load(
            Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        )
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError([f"{path}: cannot be read as YAML ({exc})"]) from None
    return parse(data, str(path))


@lru_cache(maxsize=1)
def load() -> Catalog:
    """The repository's catalog, read and checked once per process."""
    return read(CATALOG_FILE)


# -- the views and lookups the stacks, the cost estimate and the monitoring rules use -------------

CATALOG: dict[str, dict[str, InstanceType]] = load().instance_types
HOST_TYPES: dict[str, dict[str, HostType]] = load().host_types
DEFAULT_HOST_TYPE: dict[str, str] = load().default_host_type
# Per cloud, where its prices come from (one line per distinct source, region and date).
PRICE_SOURCES: dict[str, str] = {
    cloud: "; ".join(sorted({p.describe() for p in load().prices(cloud)})) for cloud in CATALOG
}
NAT_USD_PER_HOUR: dict[str, float] = {
    cloud: fees["nat_gateway_per_hour"].amount for cloud, fees in load().fees.items()
}
DISK_USD_PER_GB_MONTH: dict[str, float] = {
    cloud: fees["disk_per_gb_month"].amount for cloud, fees in load().fees.items()
}
# A stopped instance costs its volumes only (a warm pool's share of the estimate): AWS gp3.
EBS_GP3_USD_PER_GB_MONTH = DISK_USD_PER_GB_MONTH["aws"]


def instance_types(cloud: str) -> dict[str, InstanceType]:
    return CATALOG[cloud]


def lookup(cloud: str, name: str) -> InstanceType | None:
    return CATALOG.get(cloud, {}).get(name)


def by_gpu(cloud: str, gpu_model: str, gpu_count: int) -> list[InstanceType]:
    """Types carrying exactly `gpu_count` GPUs of `gpu_model`, cheapest first."""
    found = [
        t for t in CATALOG[cloud].values() if t.gpu_model == gpu_model and t.gpu_count == gpu_count
    ]
    return sorted(found, key=lambda t: t.usd_per_hour)


def same_class(base: InstanceType, limit: int = 3) -> list[InstanceType]:
    """`base` and the next-larger types with the same GPUs (model and count): the pools a
    mixed-instances group may draw spot capacity from without changing what a node can serve."""
    siblings = [
        t
        for t in by_gpu(base.cloud, base.gpu_model, base.gpu_count)
        if t.usd_per_hour >= base.usd_per_hour
    ]
    return siblings[:limit]


def gpu_models(cloud: str) -> list[str]:
    return sorted({t.gpu_model for t in CATALOG[cloud].values()})
