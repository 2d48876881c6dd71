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

The module-level names (CATALOG, HOST_TYPES, DEFAULT_HOST_TYPE, PRICE_SOURCES, FEE_PRICES) are
views of `load()`. These reference figures are the fallback of infra/pricing/, which reads a
region's own prices from the clouds' price APIs when credentials are at hand.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from torchfleet_compat.problems import InvalidInput, Problems

from infra.matrix import REPO_ROOT, GpuModel, load_matrix

FORMAT = 2
CATALOG_FILE = REPO_ROOT / "compat" / "catalog.yml"
# The estimates and caps add amounts up: one currency until a conversion exists.
CURRENCIES = ("USD",)
# The rest of the bill, per cloud (compat/catalog.yml says what each one covers).
FEES = (
    "nat_gateway_per_hour",
    "public_ipv4_per_hour",
    "disk_per_gb_month",
    "load_balancer_per_hour",
    "load_balancer_capacity_unit_per_hour",
    "bucket_per_gb_month",
    "cluster_control_plane_per_hour",
)

_PRICE_FIELDS = ("currency", "region", "source", "date")
# The keys of each kind of entry, in the order problems are reported.
_FIELDS = {
    "file": ("format", "sources", "clouds"),
    "source": ("title", "note"),
    "cloud": ("default_host_type", "families", "instance_types", "host_types", "fees"),
    "family": ("typical_spot_ratio", "source", "date"),
    "instance_type": (
        *("type", "family", "gpu", "gpus", "vcpu", "ram_gib", "instance_store", "on_demand"),
        *_PRICE_FIELDS,
    ),
    "host_type": ("type", "vcpu", "ram_gib", "instance_store", "on_demand", *_PRICE_FIELDS),
    "fees": FEES,
    "fee": ("price", *_PRICE_FIELDS),
}


def _matches(pattern: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and re.fullmatch(pattern, v) is not None


def _number(low: float, high: float = float("inf")) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, (int, float)) and low < v <= high


_COUNT = (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1")
_AMOUNT = (_number(0), "a number > 0")
_TEXT = (lambda v: isinstance(v, str) and v.strip() != "", "text")
# field -> (check, what is allowed); the fields that name another entry (family, gpu, source)
# are checked against the names the file or the matrix defines instead.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "type": (_matches(r"[a-z0-9][a-z0-9.-]*"), "an instance type name such as g5.xlarge"),
    "gpus": _COUNT,
    "vcpu": _COUNT,
    "ram_gib": _AMOUNT,
    "instance_store": (lambda v: isinstance(v, bool), "true | false"),
    "on_demand": _AMOUNT,
    "price": _AMOUNT,
    "typical_spot_ratio": (_number(0, 1), "a number in (0, 1]: spot price / on-demand price"),
    "currency": (lambda v: v in CURRENCIES, " | ".join(CURRENCIES)),
    "region": (
        _matches(r"[a-z]{2,}(-[a-z0-9]+)+"),
        "a region name such as us-east-1 or ap-southeast-1",
    ),
    "date": (
        _matches(r"\d{4}(-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?)?"),
        'a date "YYYY", "YYYY-MM" or "YYYY-MM-DD" in quotes (YAML reads an unquoted date as '
        "a date or a number)",
    ),
    "title": _TEXT,
    "note": _TEXT,
}
_NAME = _matches(r"[a-z0-9][a-z0-9.-]*")  # cloud, family and source names


class CatalogError(InvalidInput):
    """The catalog file breaks the schema: every problem, one line each."""


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
    instance_store: bool = False  # local NVMe disks (AWS: no recover action)

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
    instance_store: bool = False  # local NVMe disks (AWS: no recover action)

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


class _Check(Problems):
    """Collects every problem of one file (its `where`) instead of stopping at the first."""

    def fail(self, key: str, value: Any, allowed: str) -> None:
        self.add(key, value, allowed)

    def fields(self, key: str, raw: Any, kind: str) -> Mapping[str, Any] | None:
        """`raw` when it is a mapping with every field of `kind` (else None); unknown keys are
        problems too."""
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

    def entry(
        self, key: str, raw: Any, kind: str, names: Mapping[str, Sequence[str]] | None = None
    ) -> Mapping[str, Any] | None:
        """`raw` when it has the fields of `kind` and each passes its rule (`names`: the names
        a field that refers to another entry may take); else None, every problem recorded."""
        raw = self.fields(key, raw, kind)
        if raw is None:
            return None
        before = len(self.problems)
        for field in _FIELDS[kind]:
            value = raw[field]
            if names and field in names:
                valid, what = value in names[field], " | ".join(names[field]) or "(none)"
            else:
                check, what = _RULES[field]
                # YAML reads yes/no/on/off as booleans: only a boolean field may be one
                valid = check(value) and (field == "instance_store" or not isinstance(value, bool))
            if not valid:
                self.fail(f"{key}.{field}", value, what)
        return raw if len(self.problems) == before else None

    def names(self, key: str, raw: Any, what: str) -> dict[str, Any]:
        """A mapping of names (cloud, family, source) -> entries; bad names are problems."""
        if not isinstance(raw, dict) or not raw:
            self.fail(key, raw, f"a mapping of {what} name -> its entry")
            return {}
        for name in raw:
            if not _NAME(name):
                self.fail(f"{key}.{name}", name, f"a {what} name: lower case, digits, '.', '-'")
        return raw


def _price(row: Mapping[str, Any], amount: str, sources: Mapping[str, Source]) -> Price:
    return Price(
        float(row[amount]), row["currency"], row["region"], sources[row["source"]], row["date"]
    )


def _cloud(c: _Check, cloud: str, raw: Mapping[str, Any], cat: Catalog) -> None:
    """One cloud's section into `cat` (what is sound of it: the caller refuses a file with
    problems)."""
    key, sources = f"clouds.{cloud}", cat.sources
    families = c.names(f"{key}.families", raw["families"], "family")
    ratios = {}
    for fam, fraw in families.items():
        entry = c.entry(f"{key}.families.{fam}", fraw, "family", {"source": list(sources)})
        ratios[fam] = float(entry["typical_spot_ratio"]) if entry else 0.0
    refs = {"source": list(sources), "family": list(families), "gpu": list(load_matrix().gpus)}
    gpu_types: dict[str, InstanceType] = {}
    host_types: dict[str, HostType] = {}
    named: dict[str, list[str]] = {}  # section -> every type name it lists, sound or not
    for section, kind in (("instance_types", "instance_type"), ("host_types", "host_type")):
        named[section] = []
        rows = raw[section]
        if not isinstance(rows, list) or not rows:
            c.fail(f"{key}.{section}", rows, "a non-empty list of mappings")
            rows = []
        for i, row in enumerate(rows):
            name = row.get("type") if isinstance(row, dict) else None
            name = name if isinstance(name, str) else None
            rkey = f"{key}.{section}[{i}]" + (f" ({name})" if name else "")
            if any(name in names for names in named.values()):
                c.fail(f"{rkey}.type", name, f"a type not listed before in {key}")
            named[section] += [name] if name else []
            entry = c.entry(rkey, row, kind, refs)
            if entry is None or name is None:  # reported: nothing to build
                continue
            price, store = _price(entry, "on_demand", sources), entry["instance_store"]
            if kind == "host_type":
                ram = float(entry["ram_gib"])
                host_types[name] = HostType(cloud, name, entry["vcpu"], ram, price, store)
                continue
            gpu_types[name] = InstanceType(
                *(cloud, name, entry["family"], entry["gpu"], entry["gpus"], entry["vcpu"]),
                *(float(entry["ram_gib"]), price, ratios[entry["family"]], store),
            )
    if raw["default_host_type"] not in named["host_types"]:
        allowed = " | ".join(named["host_types"]) or "(none)"
        c.fail(f"{key}.default_host_type", raw["default_host_type"], allowed)
    fees: dict[str, Price] = {}
    for fee, fraw in (c.fields(f"{key}.fees", raw["fees"], "fees") or {}).items():
        entry = c.entry(f"{key}.fees.{fee}", fraw, "fee", {"source": list(sources)})
        if entry:
            fees[fee] = _price(entry, "price", sources)
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
    for name, raw in c.names("sources", top["sources"], "source").items():
        entry = c.entry(f"sources.{name}", raw, "source")
        if entry:
            cat.sources[name] = Source(name, entry["title"], entry["note"])
    for cloud, raw in c.names("clouds", top["clouds"], "cloud").items():
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
FEE_PRICES: dict[str, dict[str, Price]] = load().fees


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
