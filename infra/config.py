"""The stack configuration: every `torchfleet:` key, typed and validated.

`load(raw, stack)` turns the raw key/value pairs (Pulumi hands config values over as strings;
structured values as JSON) into a frozen `StackConfig`, or raises `ConfigError` listing every
bad value with the key, the value and what is allowed. The program calls it before it
registers a single resource.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import time
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from torchfleet_compat import matrix as compat
from torchfleet_compat.problems import InvalidInput, Problems

from infra import catalog, edge, pricing
from infra.addressing import BLOCKS, MAX_ZONES
from infra.catalog import InstanceType
from infra.constants import PROJECT, SERVICE_PORT
from infra.k8s import settings as k8s_settings
from infra.k8s.settings import KubernetesSettings
from infra.lifecycle import GPU_TARGET_DEFAULT, GPU_TARGET_RANGE, LAUNCH_TIMEOUT_DEFAULT_S
from infra.matrix import Matrix, load_matrix
from infra.pricing import PriceBook
from infra.schedule import DAYS, Schedule

NAMESPACE = PROJECT  # Pulumi namespaces a project's config keys by the project name
CLOUDS = ("aws", "alicloud")
ENVS = ("dev", "prod")
MODES = ("instances", "group", "kubernetes")
ROLLOUT_SUBKEYS = (
    "candidate_weight",
    "sticky_s",
    "candidate_model",
    "stable_model",
    "shadow_model",
)
POOL_MODES = ("group", "kubernetes")  # modes whose nodes come from a pool of instance types
INTERRUPTION = {"aws": ("terminate", "stop", "hibernate"), "alicloud": ("terminate", "stop")}
MAX_PRICE_RATIO = 1.3  # spot cap ceiling: paying more than 1.3x on-demand is never worth it
# When spot cannot be had: on-demand fills in (instances: `up` retries the node on-demand; AWS
# group: the on-demand fallback group; Alibaba group: ESS compensates), or the nodes stay short.
SPOT_FALLBACKS = ("on_demand", "fail")
MAX_TTL_HOURS = 24 * 30
MIN_DISK_OVERHEAD_GB = 30  # OS, driver, toolkit and logs on top of the matrix's free-disk minimum
RESERVED_TAGS = ("project", "stack", "env", "owner", "ttl-expiry", "torchfleet-role")
SSH_KEY_PREFIXES = (
    "ssh-ed25519 ",
    "ssh-rsa ",
    "ecdsa-sha2-nistp256 ",
    "ecdsa-sha2-nistp384 ",
    "ecdsa-sha2-nistp521 ",
    "sk-ssh-ed25519@openssh.com ",
)
MIN_CIDR_PREFIX = 8  # anything wider is "the internet" for our purposes
BOOT_MODES = ("cold", "bake", "baked")
# The launching hook's heartbeat timeout bounds: AWS accepts 30..7200 s, ESS 30..21600 s; below
# 300 s not even a baked node can be ready (image boot + model fetch + warm-up).
LAUNCH_TIMEOUT_RANGE = (300, 7200)
_REGION_RE = {
    "aws": re.compile(r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$"),
    "alicloud": re.compile(r"^[a-z]{2}-[a-z0-9]+(-[a-z0-9]+)?$"),
}
_IMAGE_RE = {
    "aws": re.compile(r"^ami-[0-9a-f]{8,17}$"),
    "alicloud": re.compile(r"^[A-Za-z0-9_.-]{4,}$"),
}
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_HHMM_RE = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")

REQUIRED = object()  # a key with no default: the stack must set it


@dataclass(frozen=True)
class Key:
    """One `torchfleet:` key of a stack file, declared once: its YAML type, its default (a value,
    REQUIRED, or `derived` words for a default computed from other keys), what is allowed (the
    words the docs show; the checks in load() and its helpers say the same in their errors),
    its sub-keys for structured values, and a one-line doc."""

    kind: str
    doc: str
    allowed: str
    default: Any = None
    derived: str = ""
    subkeys: tuple[str, ...] = ()

    @property
    def default_text(self) -> str:
        if self.derived:
            return self.derived
        if self.default is REQUIRED:
            return "required"
        return "unset" if self.default is None else json.dumps(self.default)


FIELDS: dict[str, Key] = {
    "cloud": Key("string", "the cloud", " | ".join(CLOUDS), derived="the stack name's <cloud>"),
    "env": Key("string", "the environment", " | ".join(ENVS), derived="the stack name's <env>"),
    "region": Key(
        "string", "the region id", "a region of the cloud (us-east-1, cn-hangzhou)", REQUIRED
    ),
    "zones": Key(
        "list",
        "zones the nodes spread over",
        f"1..{MAX_ZONES} distinct zones of the region",
        REQUIRED,
    ),
    "mode": Key(
        "string",
        "instances (fixed nodes), group (a scaling group) or kubernetes",
        " | ".join(MODES),
        derived="group for prod, else instances",
    ),
    "instance_type": Key(
        "string", "the GPU instance type", "a type of infra/catalog.py (or set gpu instead)"
    ),
    "gpu": Key(
        "mapping",
        "pick the cheapest type carrying these GPUs (instead of instance_type)",
        "{model: a GPU model of the cloud, count: 1..16}",
        subkeys=("model", "count"),
    ),
    "extra_instance_types": Key(
        "list", "more types with the same GPUs for a group's pool", "instance types of the catalog"
    ),
    "nodes": Key(
        "mapping",
        "how many nodes (count: instances mode; min/max/desired: group)",
        "integers (count 1..20, min/max/desired 0..100)",
        subkeys=("count", "min", "max", "desired"),
    ),
    "spot": Key(
        "mapping",
        "spot capacity and its price cap",
        f"enabled, max_price_ratio <= {MAX_PRICE_RATIO} x on-demand, on-demand base and "
        "percentage, interruption behaviour, on_demand_prices (per hour, the account's "
        f"currency), fallback {' | '.join(SPOT_FALLBACKS)}",
        subkeys=(
            "enabled",
            "max_price_ratio",
            "on_demand_base",
            "on_demand_percentage",
            "interruption",
            "on_demand_prices",
            "fallback",
        ),
    ),
    "schedule": Key(
        "mapping",
        "office hours: start and stop the fleet on a clock",
        "timezone (IANA), start/stop HH:MM, days",
        subkeys=("timezone", "start", "stop", "days"),
    ),
    "ttl_hours": Key(
        "number",
        "hours until the stack's resources are tagged to expire",
        f"1..{MAX_TTL_HOURS}",
        derived="required for dev instances, else unset",
    ),
    "admin_cidrs": Key(
        "list", "who may reach SSH (port 22)", f"CIDRs of /{MIN_CIDR_PREFIX} or narrower", REQUIRED
    ),
    "client_cidrs": Key(
        "list",
        "who may reach the service",
        f"CIDRs of /{MIN_CIDR_PREFIX} or narrower (unset: the VPC only)",
        [],
    ),
    "service_port": Key("integer", "the runtime's port on the nodes", "1024..65535", SERVICE_PORT),
    "ssh_public_key": Key(
        "string",
        "the operator's OpenSSH public key",
        "an OpenSSH public key line (" + ", ".join(p.strip() for p in SSH_KEY_PREFIXES) + ")",
        REQUIRED,
    ),
    "image": Key("string", "the node image", "auto | an image id (ami-... on AWS)", "auto"),
    "image_distro": Key(
        "string",
        "the distro of the auto image (and the node's Python)",
        "a distro of compat/matrix.yml",
        "debian-12",
    ),
    "cuda_profile": Key(
        "string",
        "the CUDA profile of compat/matrix.yml",
        "a profile that drives the GPU and supports the distro's Python",
        derived="the matrix's default_profile where it fits (else set it)",
    ),
    "disk_gb": Key(
        "integer",
        "the node's root disk in GiB",
        f"matrix min_free_disk_gb + {MIN_DISK_OVERHEAD_GB}..16384",
        100,
    ),
    "vpc_cidr": Key(
        "string", "the stack's VPC range", "a private IPv4 network of /16../22", "10.42.0.0/16"
    ),
    "owner": Key(
        "string",
        "who pays for and answers for the stack",
        "letters, digits, . _ @ + - (1..64)",
        REQUIRED,
    ),
    "tags": Key(
        "mapping",
        "extra tags on every resource",
        "string keys and values, none of " + ", ".join(RESERVED_TAGS),
        {},
    ),
    "budget": Key(
        "mapping",
        "the monthly budget and who is alerted",
        "monthly_usd (auto | >= 1), alert_emails, threshold_percent 1..1000",
        subkeys=("monthly_usd", "alert_emails", "threshold_percent"),
    ),
    "model_bucket": Key(
        "string",
        "the bucket nodes fetch models from",
        "an S3 / OSS bucket name (lowercase, 3..63 chars)",
    ),
    "scaling": Key(
        "mapping",
        "the group's scaling targets",
        "per-node requests and queue depth, gpu_utilization_percent "
        f"{GPU_TARGET_RANGE[0]}..{GPU_TARGET_RANGE[1]}, "
        "scale_in, protect_from_scale_in, launch_timeout_s "
        f"{LAUNCH_TIMEOUT_RANGE[0]}..{LAUNCH_TIMEOUT_RANGE[1]}",
        subkeys=(
            "requests_per_node",
            "queue_depth_per_node",
            "gpu_utilization_percent",
            "scale_in",
            "protect_from_scale_in",
            "launch_timeout_s",
        ),
    ),
    "boot": Key(
        "string",
        "how nodes boot: configure from scratch, bake an image, or boot baked",
        " | ".join(BOOT_MODES),
        "cold",
    ),
    "warm_pool": Key(
        "mapping",
        "a pool of stopped, prepared nodes (AWS group mode)",
        "enabled, min_size 0..100, max_prepared 1..100",
        subkeys=("enabled", "min_size", "max_prepared"),
    ),
    "kubernetes": Key(
        "mapping",
        "the cluster of mode: kubernetes",
        "see infra/k8s/settings.py",
        subkeys=k8s_settings.SUBKEYS,
    ),
    "tls": Key(
        "mapping",
        "HTTPS at the load balancer (required for a stack with client_cidrs, dev included)",
        "certificate (an ACM ARN on aws, a CLB server certificate id on alicloud, or generate: "
        "a dev group stack's own CA, its PEM the output tls_ca_pem), "
        "min_version 1.2 | 1.3 (1.2 on alicloud), redirect_http (default true: HTTP answers 301)",
        subkeys=edge.SUBKEYS,
    ),
    "api_token": Key(
        "string",
        "the bearer token clients send (set it as a Pulumi secret)",
        "16-512 of A-Z a-z 0-9 . _ ~ + / = -",
        derived="generated once (pulumi_random), kept as a Pulumi secret",
    ),
    "api_token_next": Key(
        "string",
        "the next token during a rotation: nodes accept both (torchfleet rotate-token sets it)",
        "16-512 of A-Z a-z 0-9 . _ ~ + / = -, not api_token",
    ),
    "monitoring": Key(
        "mapping",
        "the stack's monitoring host",
        "enabled, instance_type, disk_gb",
        subkeys=("enabled", "instance_type", "disk_gb"),
    ),
    "access": Key(
        "mapping",
        "how operators reach the nodes besides SSH from admin_cidrs (docs/security.md)",
        "ssm true | false (AWS: the nodes' role gets AmazonSSMManagedInstanceCore: Session "
        "Manager shells and Run Command on them; default false)",
        subkeys=("ssm",),
    ),
    "rollout": Key(
        "mapping",
        "a candidate model beside the stable one at the load balancer (docs/rollouts.md); "
        "unset: one version, today's plan",
        "candidate_weight 0..100 (percent of requests), sticky_s 0..604800 (AWS: ALB "
        "stickiness across the two target groups), candidate_model (kubernetes: the candidate's "
        "file in the model volume, default candidate.pt; group: <sha256>.pt in model_bucket "
        "under models/, served by a candidate Auto Scaling / ESS group; required while "
        "candidate_weight > 0), "
        "stable_model (kubernetes: the stable Deployment's file there, default model.pt; "
        "group: <sha256>.pt there, served by the stable group instead of the bundle's model; "
        "a promotion moves it), shadow_model (kubernetes: a file there the stable pods run as "
        "their shadow, set and removed by `torchfleet rollout --strategy shadow`); "
        "mode: group (aws; alicloud: a candidate ESS group in the CLB's "
        "VServer group, candidate_weight up to the share its weights reach, sticky_s up to 86400: "
        "the CLB's cookie), or "
        "mode: kubernetes",
        subkeys=ROLLOUT_SUBKEYS,
    ),
}
KEYS = tuple(FIELDS)
# Sub-keys of the structured values, for the same "unknown key" check one level down.
SUBKEYS = {name: key.subkeys for name, key in FIELDS.items() if key.subkeys}


def readme_table() -> str:
    """docs/configuration.md's table of stack keys, from FIELDS (tests check it is current)."""
    rows = ["| Key | Type | Default | Allowed | What |", "|---|---|---|---|---|"]
    for name, key in FIELDS.items():
        cells = (
            f"`{name}`" + (" (" + ", ".join(key.subkeys) + ")" if key.subkeys else ""),
            key.kind,
            key.default_text,
            key.allowed,
            key.doc,
        )
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


# The monitoring host's disk: 30 days of samples plus the nodes' journals (roles/monitoring:
# monitoring_logs_max_use 20G); its README sizes 50 GiB.
MONITORING_DISK_GB = (30, 16384)
MONITORING_DISK_DEFAULT_GB = 50


class ConfigError(InvalidInput):
    """Every problem found in one pass, one line each."""

    heading = "invalid stack configuration:"


@dataclass(frozen=True)
class Nodes:
    count: int  # instances mode
    min: int  # group mode
    max: int
    desired: int


@dataclass(frozen=True)
class Spot:
    enabled: bool
    max_price_ratio: float
    on_demand_base: int
    on_demand_percentage: int
    interruption: str
    on_demand_prices: Mapping[str, float] = field(default_factory=dict)
    fallback: str = "on_demand"  # SPOT_FALLBACKS


@dataclass(frozen=True)
class Budget:
    monthly_usd: float | None  # None: derived from the cost estimate
    alert_emails: tuple[str, ...]
    threshold_percent: int


@dataclass(frozen=True)
class Scaling:
    """Scaling on load (group mode): the per-node targets the policies track."""

    requests_per_node: float  # requests per node per minute (ALBRequestCountPerTarget's unit)
    queue_depth_per_node: float | None  # None: derived from the request target (infra.lifecycle)
    gpu_utilization_percent: float  # the mean GPU utilisation per node the GPU policy holds
    scale_in: bool  # False: the load policies only ever add nodes
    protect_from_scale_in: bool  # new nodes are protected; only schedules/operators remove them
    launch_timeout_s: int  # the launching hook's heartbeat timeout


@dataclass(frozen=True)
class WarmPool:
    min_size: int
    max_prepared: int | None  # None: AWS keeps max_size - desired warm


@dataclass(frozen=True)
class Monitoring:
    """The stack's monitoring host (roles/monitoring): Prometheus, Alertmanager and the
    journal receiver, in a private subnet of the stack's VPC."""

    instance_type: catalog.HostType
    disk_gb: int


# Alibaba group mode: each stable node's weight in the CLB's VServer group, ESS's default
# LoadBalancerWeight (what the nodes had in the default server group before the VServer group).
STABLE_BACKEND_WEIGHT = 50
# The CLB's CookieTimeout for an inserted cookie: 1..86400 s.
CLB_COOKIE_MAX_S = 86400


@dataclass(frozen=True)
class RolloutSplit:
    """The `rollout` block: the candidate's share of requests at the load balancer."""

    candidate_weight: int  # percent; the stable version gets the rest
    # a client stays on its track this long (0: off): AWS, ALB stickiness across the two target
    # groups; Alibaba group mode, the CLB's inserted cookie (its node, so its track)
    sticky_s: int = 0
    candidate_model: str = "candidate.pt"  # kubernetes: the candidate's file in the model volume
    stable_model: str = "model.pt"  # kubernetes: the stable Deployment's file there (promotion)
    # kubernetes: a file there the stable pods run as their shadow (`--strategy shadow`)
    shadow_model: str | None = None

    def candidate_replicas(self, stable: int) -> int:
        """Kubernetes splits by replicas: beside `stable` replicas, as many candidate ones as
        give the weight (at least one while it is above 0; 100 % is a promotion, not a split)."""
        w = self.candidate_weight
        return 0 if w == 0 else max(1, round(stable * w / (100 - w)))

    def candidate_size(self, stable_min: int, most: int) -> int:
        """The candidate track's size beside a stable track of at least `stable_min` (replicas
        or nodes) within `most` in all: as many as give the weight, at least one while it is
        above 0, at most `most` less `stable_min` (a split near 100 % would otherwise ask for
        more than the fleet may hold); 100 % (group mode's promotion step) is that cap."""
        w = self.candidate_weight
        if w == 0:
            return 0
        cap = max(1, most - stable_min)
        return cap if w == 100 else min(cap, self.candidate_replicas(stable_min))

    def backend_weight(self, stable_min: int, most: int) -> int:
        """Alibaba group mode splits in one VServer group by a weight per scaling group: each
        stable node at STABLE_BACKEND_WEIGHT, each of the candidate_size nodes at the weight
        returned (1..100), so that n_c * w_c / (n_c * w_c + n_s * w_s), with n_s the stable
        group's minimum, is the candidate_weight (rounded; backend_share gives the exact one).
        0 without candidate nodes; 100 (the CLB's most) when the stable minimum is 0 or the
        weight asks for more, which max_backend_share (the config check) refuses."""
        n, p = self.candidate_size(stable_min, most), self.candidate_weight
        if n == 0:
            return 0
        if p == 100 or stable_min == 0:
            return 100
        want = STABLE_BACKEND_WEIGHT * stable_min * p / (n * (100 - p))
        return max(1, min(100, round(want)))

    def backend_share(self, stable_min: int, most: int) -> float:
        """The candidate's percent of requests the VServer group's weights give beside a stable
        group at its minimum (more stable nodes: a smaller share)."""
        n, w = self.candidate_size(stable_min, most), self.backend_weight(stable_min, most)
        total = n * w + stable_min * STABLE_BACKEND_WEIGHT
        return 100 * n * w / total if total else 0.0

    @staticmethod
    def max_backend_share(stable_min: int, most: int) -> int:
        """The largest candidate_weight the VServer group's weights can give (whole percent):
        the candidate_size cap (most less stable_min) at weight 100 beside the stable minimum at
        STABLE_BACKEND_WEIGHT (the stable group's weight never moves: ESS detaches and
        re-attaches a group whose weight changes, all its nodes at once)."""
        cap = max(1, most - stable_min)
        return 100 * cap * 100 // (cap * 100 + stable_min * STABLE_BACKEND_WEIGHT)


def model_digest(name: str) -> str | None:
    """The SHA-256 a content-addressed model file's name carries (`<64 hex>.pt`, the name
    `torchfleet rollout` places a checked copy under), or None for another name."""
    m = re.fullmatch(r"([0-9a-f]{64})\.pt", name)
    return m.group(1) if m else None


@dataclass(frozen=True)
class StackConfig:
    stack: str
    cloud: str
    env: str
    region: str
    zones: tuple[str, ...]
    mode: str
    instance_type: InstanceType
    instance_types: tuple[InstanceType, ...]  # the primary first; more only in group mode
    nodes: Nodes
    spot: Spot
    schedule: Schedule | None
    ttl_hours: float | None
    admin_cidrs: tuple[str, ...]
    client_cidrs: tuple[str, ...]
    service_port: int
    ssh_public_key: str
    image: str  # "auto" or an image id
    image_distro: str
    cuda_profile: str
    disk_gb: int
    vpc_cidr: str
    owner: str
    tags: Mapping[str, str]
    budget: Budget | None
    model_bucket: str | None
    scaling: Scaling | None = None  # group mode only
    boot: str = (
        "cold"  # cold: full site.yml at boot | bake: build an image first | baked: `image` is one
    )
    warm_pool: WarmPool | None = None  # AWS group mode only

    kubernetes: KubernetesSettings | None = None  # mode: kubernetes only
    monitoring: Monitoring | None = None  # None: no monitoring host
    rollout: RolloutSplit | None = None  # None: one version behind the load balancer
    ssm: bool = False  # access.ssm: AWS Session Manager on the nodes (docs/security.md)
    tls: edge.Tls | None = None  # None: plain HTTP at the load balancer (never public)
    api_token: str | None = field(default=None, repr=False)  # None: generated (infra.edge)
    api_token_next: str | None = field(default=None, repr=False)  # during a rotation only
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


# -- reading --------------------------------------------------------------------------------------


class _Reader(Problems):
    """Reads raw values, records problems (torchfleet_compat's collector and sentence) instead
    of stopping at the first."""

    def __init__(self, raw: Mapping[str, Any]):
        super().__init__()
        self.raw = raw

    def fail(self, key: str, value: Any, allowed: str | None = None) -> None:
        """One problem: the key, the value and what is allowed (by default the key's declared
        `allowed`, FIELDS; a check passes its own words only where it knows more, e.g. the
        zones of this region)."""
        if allowed is None:
            allowed = FIELDS[key].allowed
        self.add(f"{NAMESPACE}:{key}", value, allowed)

    def kinds(self) -> bool:
        """Every key that is set against its declared YAML kind, before any check reads it (a
        mapping where a string belongs must not reach a lookup). True when all match."""
        ok = True
        for key, value in self.raw.items():
            decl = FIELDS.get(key)
            if decl is not None and value is not None and not _has_kind(decl.kind, value):
                self.fail(key, value, f"a YAML {decl.kind}: {decl.allowed}")
                ok = False
        return ok

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value; unset, `default`, else the key's declared default (FIELDS)."""
        if (
            default is None
            and key in FIELDS
            and not FIELDS[key].derived
            and FIELDS[key].default is not REQUIRED
        ):
            default = FIELDS[key].default
        return self.raw.get(key, default)

    def structured(self, key: str, kind: type) -> Any:
        value = self.raw.get(key)
        if isinstance(value, str) and kind is not str:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                self.fail(key, value, f"a YAML {kind.__name__}")
                return None
        if value is not None and not isinstance(value, kind):
            self.fail(key, value, f"a YAML {kind.__name__}")
            return None
        if isinstance(value, dict) and key in SUBKEYS:
            for sub in value:
                if sub not in SUBKEYS[key]:
                    self.fail(f"{key}.{sub}", value[sub], f"the keys {', '.join(SUBKEYS[key])}")
        return value

    def choice(self, key: str, value: Any, allowed: tuple[str, ...]) -> str | None:
        if value not in allowed:
            self.fail(key, value, " | ".join(allowed))
            return None
        return value

    def number(
        self,
        key: str,
        value: Any,
        kind: Callable[[Any], Any],
        lo: float | None,
        hi: float | None,
        what: str | None = None,
    ) -> Any:
        try:
            if isinstance(value, bool):
                raise ValueError
            number = kind(value)
            if kind is int and float(value) != number:
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            self.fail(key, value, what)
            return None
        if not math.isfinite(number):  # NaN passes every comparison below; inf is no quantity
            self.fail(key, value, what)
            return None
        if (lo is not None and number < lo) or (hi is not None and number > hi):
            self.fail(key, value, what)
            return None
        return number

    def boolean(self, key: str, value: Any) -> bool | None:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.fail(key, value, "true | false")
        return None

    def cidrs(self, key: str, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(key, value, "a list of CIDRs")
            return ()
        out = []
        for item in value:
            try:
                net = ipaddress.ip_network(str(item), strict=False)
            except ValueError:
                self.fail(key, item, "an IPv4/IPv6 CIDR such as 203.0.113.0/24")
                continue
            if net.prefixlen < MIN_CIDR_PREFIX:
                self.fail(
                    key,
                    item,
                    f"a CIDR of /{MIN_CIDR_PREFIX} or narrower (never the whole "
                    "internet: use a bastion, a VPN or your office range)",
                )
                continue
            out.append(str(net))
        return tuple(out)


def _has_kind(kind: str, value: Any) -> bool:
    """Whether a raw value is of a declared kind. Pulumi hands structured values over as JSON
    text and numbers as text too; the checks in load() parse them and judge the range."""
    if kind in ("list", "mapping"):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                return False
        return isinstance(value, list if kind == "list" else dict)
    if kind in ("integer", "number"):
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                return False
            return True
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)


def _stack_parts(stack: str) -> tuple[str | None, str | None]:
    cloud, _, env = stack.partition("-")
    return (cloud if cloud in CLOUDS else None, env if env in ENVS else None)


def load(raw: Mapping[str, Any], stack: str, matrix: Matrix | None = None) -> StackConfig:
    """Validate `raw` (keys without the `torchfleet:` prefix) for `stack`."""
    matrix = matrix or load_matrix()
    r = _Reader(raw)
    for key in raw:
        if key not in KEYS:
            r.fail(key, raw[key], f"the keys {', '.join(KEYS)}")
    if not r.kinds():
        raise ConfigError(r.problems)  # the checks below read values of the declared kinds

    stack_cloud, stack_env = _stack_parts(stack)
    cloud = r.choice("cloud", r.get("cloud", stack_cloud), CLOUDS)
    env = r.choice("env", r.get("env", stack_env), ENVS)
    if cloud and stack_cloud and cloud != stack_cloud:
        r.fail(
            "cloud", cloud, f"{stack_cloud!r} (stacks are named <cloud>-<env>; this is {stack!r})"
        )
    if cloud is None:
        raise ConfigError(r.problems)  # nothing below means anything without the cloud

    region = r.get("region")
    if not isinstance(region, str) or not _REGION_RE[cloud].match(region):
        r.fail(
            "region",
            region,
            f"a region id of {cloud} such as {'us-east-1' if cloud == 'aws' else 'cn-hangzhou'}",
        )
        region = None
    zones = _zones(r, cloud, region)

    mode = r.choice("mode", r.get("mode", "group" if env == "prod" else "instances"), MODES)
    itype = _instance_type(r, cloud)
    warm_pool = _warm_pool(r, cloud, mode)
    itypes = _extra_types(r, cloud, itype, mode, single=warm_pool is not None)
    nodes = _nodes(r, mode)
    spot = _spot(r, cloud, mode, itypes)
    scaling = _scaling(r, mode)
    boot = _boot(r, cloud)
    schedule = _schedule(r)
    ttl = _ttl(r, env, mode)

    admin = r.cidrs("admin_cidrs", r.structured("admin_cidrs", list))
    if not admin and "admin_cidrs" not in raw:
        r.fail("admin_cidrs", None, "at least one CIDR that may reach SSH (port 22)")
    client = r.cidrs("client_cidrs", r.structured("client_cidrs", list))
    port = r.number("service_port", r.get("service_port"), int, 1024, 65535)
    key = r.get("ssh_public_key")
    if not isinstance(key, str) or not key.startswith(SSH_KEY_PREFIXES):
        r.fail(
            "ssh_public_key",
            key if not isinstance(key, str) else key[:24] + "...",
        )

    image = r.get("image")
    if image != "auto" and (not isinstance(image, str) or not _IMAGE_RE[cloud].match(image)):
        r.fail("image", image)
    distro = r.choice("image_distro", r.get("image_distro"), tuple(matrix.distros))

    profile = _cuda_profile(r, matrix, itype, distro if mode != "kubernetes" else None)
    min_disk = matrix.min_free_disk_gb + MIN_DISK_OVERHEAD_GB
    disk = r.number(
        "disk_gb",
        r.get("disk_gb"),
        int,
        min_disk,
        16384,
        f"an integer number of GiB in {min_disk}..16384 (the matrix asks for "
        f"{matrix.min_free_disk_gb} GiB free after the OS)",
    )
    vpc_cidr = _vpc_cidr(r, len(zones))
    owner = r.get("owner")
    if not isinstance(owner, str) or not re.match(r"^[A-Za-z0-9._@+-]{1,64}$", owner):
        r.fail("owner", owner)
    tags = _tags(r)
    budget = _budget(r, cloud)
    bucket = r.get("model_bucket")
    if bucket is not None and (
        not isinstance(bucket, str) or not re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", bucket)
    ):
        r.fail("model_bucket", bucket)
        bucket = None

    _cross_checks(r, cloud, env, mode, zones, nodes, spot, schedule, client)
    _fleet_checks(r, image, boot, nodes, spot, warm_pool)
    kubernetes = _kubernetes(r, cloud, mode, zones, itypes, nodes, spot, image, bucket)
    monitoring = _monitoring(r, cloud, mode)
    rollout = _rollout(r, cloud, mode, nodes)
    ssm = _access(r, cloud)
    tls = edge.parse_tls(
        r,
        r.structured("tls", dict),
        cloud=cloud,
        region=region or "",
        env=env,
        mode=mode,
        client_cidrs=client,
    )
    token = edge.check_token(r, "api_token", r.get("api_token"))
    token_next = edge.check_token(r, "api_token_next", r.get("api_token_next"))
    if token_next is not None and token_next == token:
        r.fail("api_token_next", "(secret)", "a token other than api_token")
    if r.problems:
        raise ConfigError(r.problems)
    assert env and mode and itype and nodes and spot and port and distro and profile and disk
    return StackConfig(
        stack=stack,
        cloud=cloud,
        env=env,
        region=region,
        zones=zones,
        mode=mode,
        instance_type=itype,
        instance_types=itypes,
        nodes=nodes,
        spot=spot,
        schedule=schedule,
        ttl_hours=ttl,
        admin_cidrs=admin,
        client_cidrs=client,
        service_port=port,
        ssh_public_key=key.strip(),
        image=image,
        image_distro=distro,
        cuda_profile=profile,
        disk_gb=disk,
        vpc_cidr=vpc_cidr,
        owner=owner,
        tags=tags,
        budget=budget,
        model_bucket=bucket,
        scaling=scaling,
        boot=boot or "cold",
        warm_pool=warm_pool,
        kubernetes=kubernetes,
        monitoring=monitoring,
        rollout=rollout,
        ssm=ssm,
        tls=tls,
        api_token=token,
        api_token_next=token_next,
    )


def _zones(r: _Reader, cloud: str, region: str | None) -> tuple[str, ...]:
    zones = r.structured("zones", list)
    if not zones:
        r.fail("zones", zones, "a non-empty list of zones in the region")
        return ()
    out = []
    for z in zones:
        ok = (
            isinstance(z, str)
            and region is not None
            and (
                re.match(rf"^{re.escape(region)}[a-z]$", z)
                if cloud == "aws"
                else re.match(rf"^{re.escape(region)}-[a-z]$", z)
            )
        )
        if not ok:
            example = f"{region}a" if cloud == "aws" else f"{region}-h"
            r.fail("zones", z, f"a zone of region {region!r} such as {example!r}")
        else:
            out.append(z)
    if len(set(out)) != len(out):
        r.fail("zones", zones, "distinct zones")
    if len(zones) > MAX_ZONES:
        r.fail(
            "zones",
            zones,
            f"at most {MAX_ZONES} zones (the address plan gives each zone "
            f"1/{BLOCKS} of vpc_cidr and keeps the last block for the services subnet)",
        )
        return tuple(out[:MAX_ZONES])
    return tuple(out)


def _instance_type(r: _Reader, cloud: str) -> InstanceType | None:
    name, gpu = r.get("instance_type"), r.structured("gpu", dict)
    if name is not None and gpu is not None:
        r.fail("gpu", gpu, "either instance_type or gpu, not both")
        return None
    if name is not None:
        found = catalog.lookup(cloud, name)
        if found is None:
            r.fail(
                "instance_type",
                name,
                f"a GPU type of the {cloud} catalog: " + ", ".join(catalog.instance_types(cloud)),
            )
        return found
    if gpu is None:
        r.fail(
            "instance_type",
            None,
            "an instance type, or `gpu: {model, count}` to pick the "
            "cheapest type carrying those GPUs",
        )
        return None
    model = gpu.get("model")
    count = r.number("gpu.count", gpu.get("count", 1), int, 1, 16, "an integer 1..16")
    if model not in catalog.gpu_models(cloud):
        r.fail(
            "gpu.model",
            model,
            f"a GPU model offered on {cloud}: " + ", ".join(catalog.gpu_models(cloud)),
        )
        return None
    if count is None:
        return None
    matches = catalog.by_gpu(cloud, model, count)
    if not matches:
        counts = sorted(
            {t.gpu_count for t in catalog.instance_types(cloud).values() if t.gpu_model == model}
        )
        r.fail("gpu.count", count, f"a count {cloud} offers for {model}: {counts}")
        return None
    return matches[0]


def _extra_types(
    r: _Reader, cloud: str, base: InstanceType | None, mode: str | None, single: bool
) -> tuple[InstanceType, ...]:
    if base is None:
        return ()
    extra = r.structured("extra_instance_types", list)
    if extra is None:
        return tuple(catalog.same_class(base)) if mode in POOL_MODES and not single else (base,)
    if mode not in POOL_MODES:
        r.fail(
            "extra_instance_types",
            extra,
            "only in mode: group | kubernetes (instances mode uses one type)",
        )
        return (base,)
    if single:
        r.fail(
            "extra_instance_types",
            extra,
            "unset with warm_pool (AWS warm pools refuse "
            "groups with a mixed instances policy: the group launches one type)",
        )
        return (base,)
    out = [base]
    for name in extra:
        found = catalog.lookup(cloud, name)
        if found is None:
            r.fail(
                "extra_instance_types",
                name,
                "types of the catalog: " + ", ".join(catalog.instance_types(cloud)),
            )
        elif (found.gpu_model, found.gpu_count) != (base.gpu_model, base.gpu_count):
            r.fail(
                "extra_instance_types",
                name,
                f"types with the same GPUs as {base.name} ({base.gpu_count}x {base.gpu_model})"
                " so every node serves the same model the same way",
            )
        elif found not in out:
            out.append(found)
    return tuple(out)


def _nodes(r: _Reader, mode: str | None) -> Nodes | None:
    raw = r.structured("nodes", dict) or {}
    count = r.number("nodes.count", raw.get("count", 1), int, 1, 20, "an integer 1..20")
    lo = r.number("nodes.min", raw.get("min", 1), int, 0, 100, "an integer 0..100")
    hi = r.number("nodes.max", raw.get("max", max(lo or 1, 2)), int, 1, 100, "an integer 1..100")
    desired = r.number(
        "nodes.desired", raw.get("desired", lo or 1), int, 0, 100, "an integer 0..100"
    )
    if None in (count, lo, hi, desired):
        return None
    if mode in POOL_MODES and not lo <= desired <= hi:
        r.fail("nodes", raw, f"min <= desired <= max (got {lo} <= {desired} <= {hi})")
    return Nodes(count=count, min=lo, max=hi, desired=desired)


def _spot(
    r: _Reader, cloud: str, mode: str | None, itypes: tuple[InstanceType, ...]
) -> Spot | None:
    raw = r.structured("spot", dict) or {}
    enabled = r.boolean("spot.enabled", raw.get("enabled", False))
    ratio = r.number(
        "spot.max_price_ratio",
        raw.get("max_price_ratio", 1.0),
        float,
        None,
        MAX_PRICE_RATIO,
        f"a number > 0 and <= {MAX_PRICE_RATIO} (the cap is this ratio x on-demand)",
    )
    if ratio is not None and ratio <= 0:
        r.fail(
            "spot.max_price_ratio",
            ratio,
            f"a number > 0 and <= {MAX_PRICE_RATIO} (the cap is this ratio x on-demand)",
        )
        ratio = None
    base = r.number(
        "spot.on_demand_base",
        raw.get("on_demand_base", 0),
        int,
        0,
        100,
        "an integer 0..100 (on-demand nodes before any spot)",
    )
    pct = r.number(
        "spot.on_demand_percentage",
        raw.get("on_demand_percentage", 0),
        int,
        0,
        100,
        "an integer percentage 0..100 of on-demand above the base",
    )
    interruption = r.choice(
        "spot.interruption", raw.get("interruption", "terminate"), INTERRUPTION[cloud]
    )
    prices = raw.get("on_demand_prices", {})
    if not isinstance(prices, dict):
        r.fail(
            "spot.on_demand_prices",
            prices,
            "a map of instance type -> price per hour in the account's currency",
        )
        prices = {}
    for name, price in prices.items():
        if catalog.lookup(cloud, name) is None:
            r.fail("spot.on_demand_prices", name, "instance types of the catalog")
        r.number(f"spot.on_demand_prices.{name}", price, float, 0.0001, None, "a price > 0")
    fallback = r.choice("spot.fallback", raw.get("fallback", "on_demand"), SPOT_FALLBACKS)
    if (
        enabled is None
        or ratio is None
        or base is None
        or pct is None
        or interruption is None
        or fallback is None
    ):
        return None
    if mode == "instances" and (base or pct) and enabled:
        r.fail(
            "spot.on_demand_base",
            base,
            "0 in mode: instances (every node is spot when "
            "spot.enabled; use mode: group for an on-demand base)",
        )
    return Spot(
        enabled=enabled,
        max_price_ratio=ratio,
        on_demand_base=base,
        on_demand_percentage=pct,
        interruption=interruption,
        on_demand_prices={k: float(v) for k, v in prices.items()},
        fallback=fallback,
    )


def _scaling(r: _Reader, mode: str | None) -> Scaling | None:
    raw = r.structured("scaling", dict)
    if mode != "group":
        if raw is not None:
            r.fail("scaling", raw, "unset in mode: instances (only a group scales on load)")
        return None
    raw = raw or {}
    what = (
        "requests per node per minute the request policy holds the group at (> 0): 0.7 x "
        "the sustained req/s `torchfleet-bench load URL` measures on one node, x 60"
    )
    requests = raw.get("requests_per_node")
    if requests is None:
        r.fail("scaling.requests_per_node", None, what)
    else:
        requests = r.number("scaling.requests_per_node", requests, float, 0.001, 1e7, what)
    queue = raw.get("queue_depth_per_node")
    if queue is not None:
        queue = r.number(
            "scaling.queue_depth_per_node",
            queue,
            float,
            0.01,
            1e5,
            "a number > 0 of requests waiting per node (Average over the group)",
        )
    lo, hi = GPU_TARGET_RANGE
    gpu = r.number(
        "scaling.gpu_utilization_percent",
        raw.get("gpu_utilization_percent", GPU_TARGET_DEFAULT),
        float,
        lo,
        hi,
        f"a number in {lo}..{hi}: the mean GPU utilisation per node the GPU policy holds",
    )
    scale_in = r.boolean("scaling.scale_in", raw.get("scale_in", True))
    protect = r.boolean("scaling.protect_from_scale_in", raw.get("protect_from_scale_in", False))
    lo, hi = LAUNCH_TIMEOUT_RANGE
    timeout = r.number(
        "scaling.launch_timeout_s",
        raw.get("launch_timeout_s", LAUNCH_TIMEOUT_DEFAULT_S),
        int,
        lo,
        hi,
        f"an integer number of seconds in {lo}..{hi} (the launching "
        "lifecycle hook's heartbeat timeout; AWS allows at most 7200)",
    )
    if requests is None or gpu is None or scale_in is None or protect is None or timeout is None:
        return None
    return Scaling(
        requests_per_node=requests,
        queue_depth_per_node=queue,
        gpu_utilization_percent=gpu,
        scale_in=scale_in,
        protect_from_scale_in=protect,
        launch_timeout_s=timeout,
    )


def _access(r: _Reader, cloud: str) -> bool:
    """`access.ssm`: Session Manager on the nodes, only where the stack asks (AWS only)."""
    raw = r.structured("access", dict) or {}
    ssm = r.boolean("access.ssm", raw.get("ssm", False))
    if ssm and cloud != "aws":
        r.fail("access.ssm", True, "false on alicloud (Session Manager is AWS's)")
        return False
    return bool(ssm)


def _monitoring(r: _Reader, cloud: str, mode: str | None) -> Monitoring | None:
    """The `monitoring` block; every sub-key is checked even while `enabled` is false."""
    raw = r.structured("monitoring", dict)
    if raw is None:
        return None
    enabled = r.boolean("monitoring.enabled", raw.get("enabled", False))
    types = catalog.HOST_TYPES[cloud]
    name = raw.get("instance_type", catalog.DEFAULT_HOST_TYPE[cloud])
    itype = types.get(name) if isinstance(name, str) else None
    if itype is None:
        r.fail(
            "monitoring.instance_type", name, f"a general-purpose {cloud} type: " + ", ".join(types)
        )
    lo, hi = MONITORING_DISK_GB
    disk = r.number(
        "monitoring.disk_gb",
        raw.get("disk_gb", MONITORING_DISK_DEFAULT_GB),
        int,
        lo,
        hi,
        f"an integer number of GiB in {lo}..{hi} (30 days of samples plus the nodes' journals)",
    )
    if not enabled:
        return None
    if mode == "kubernetes":
        r.fail(
            "monitoring.enabled",
            True,
            "false in mode: kubernetes (the cluster's own Prometheus scrapes the pods)",
        )
        return None
    if r.get("ttl_hours") is not None:
        # The TTL and the working-hours schedules act on the GPU nodes only.
        r.fail(
            "monitoring.enabled",
            True,
            "false while ttl_hours is set (the TTL releases the "
            "GPU nodes only; a monitoring host would outlive it)",
        )
        return None
    if itype is None or disk is None:
        return None
    return Monitoring(instance_type=itype, disk_gb=disk)


def _rollout(r: _Reader, cloud: str, mode: str | None, nodes: Nodes | None) -> RolloutSplit | None:
    raw = r.structured("rollout", dict)
    if raw is None:
        return None
    if mode not in ("group", "kubernetes"):
        r.fail(
            "rollout",
            raw,
            "unset in mode: instances (no load balancer to split at: "
            "`torchfleet rollout` on the local fleet)",
        )
        return None
    weight = r.number(
        "rollout.candidate_weight",
        raw.get("candidate_weight", 0),
        int,
        0,
        100,
        "an integer percent 0..100",
    )
    sticky = r.number(
        "rollout.sticky_s",
        raw.get("sticky_s", 0),
        int,
        0,
        604800,
        "0 (off) or seconds up to 604800 (the ALB's limit)",
    )
    files = {}
    for sub, example in (("candidate_model", "candidate.pt"), ("stable_model", "model.pt")):
        files[sub] = raw.get(sub, getattr(RolloutSplit, sub))
        if not isinstance(files[sub], str) or not re.fullmatch(
            r"[A-Za-z0-9._-]{1,128}\.pt", files[sub]
        ):
            r.fail(f"rollout.{sub}", files[sub], f"a file name ending .pt, such as {example}")
            return None
    shadow = raw.get("shadow_model")
    if shadow is not None:
        if not isinstance(shadow, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,128}\.pt", shadow):
            r.fail("rollout.shadow_model", shadow, "a file name ending .pt, such as shadow.pt")
            return None
        if mode != "kubernetes":
            r.fail(
                "rollout.shadow_model",
                shadow,
                "unset outside mode: kubernetes (a group's nodes take a new file by being "
                "replaced: every node twice for one shadow test)",
            )
            return None
    if mode == "group":
        # group mode: the block's files are what nodes download and verify, so their names are
        # the stack's content-addressed copies (the digest is the checksum) in model_bucket
        for sub in ("candidate_model", "stable_model"):
            if sub in raw and model_digest(files[sub]) is None:
                r.fail(
                    f"rollout.{sub}",
                    files[sub],
                    "in mode: group, <sha256 of the file, 64 lowercase hex>.pt: the copy "
                    "`torchfleet rollout` places in model_bucket under models/",
                )
                return None
            if sub in raw and not r.get("model_bucket"):
                r.fail(
                    f"rollout.{sub}",
                    files[sub],
                    "unset without model_bucket (the nodes download the file from it)",
                )
                return None
    if mode == "group" and weight and "candidate_model" not in raw:
        # a share for a candidate target group without nodes: that share would get 503s
        r.fail(
            "rollout.candidate_model",
            None,
            "set while candidate_weight is above 0 in mode: group (the candidate group's "
            "model, <sha256>.pt in model_bucket under models/), or candidate_weight 0",
        )
        return None
    if weight == 100 and mode == "kubernetes":
        r.fail(
            "rollout.candidate_weight",
            weight,
            "0..99 in mode: kubernetes (the split is by replicas beside the stable Deployment; "
            "100 % is the stable Deployment on the candidate's model)",
        )
        return None
    if cloud == "alicloud" and mode == "group" and sticky is not None and sticky > CLB_COOKIE_MAX_S:
        r.fail(
            "rollout.sticky_s",
            sticky,
            f"0 (off) or seconds up to {CLB_COOKIE_MAX_S} on alicloud in mode: group (the CLB "
            "listener's inserted cookie, which keeps a client on its node and so on its track)",
        )
        return None
    if cloud == "alicloud" and mode == "group" and weight is not None and nodes is not None:
        most = RolloutSplit.max_backend_share(nodes.min, nodes.max)
        if weight > most:
            r.fail(
                "rollout.candidate_weight",
                weight,
                f"0..{most} on alicloud in mode: group with nodes.min {nodes.min} and nodes.max "
                f"{nodes.max} (the most the VServer group's weights give: "
                f"{max(1, nodes.max - nodes.min)} candidate nodes at weight 100 beside "
                f"{nodes.min} stable ones at {STABLE_BACKEND_WEIGHT}; a promotion is "
                "stable_model)",
            )
            return None
    if weight is None or sticky is None:
        return None
    return RolloutSplit(
        candidate_weight=weight,
        sticky_s=sticky,
        candidate_model=files["candidate_model"],
        stable_model=files["stable_model"],
        shadow_model=shadow,
    )


def _boot(r: _Reader, cloud: str) -> str | None:
    boot = r.choice("boot", r.get("boot"), BOOT_MODES)
    if boot == "bake" and cloud == "alicloud":
        # pulumi_alicloud 4.0.0: ecs.EcsImagePipeline's build instance takes no RAM role, so it
        # cannot read the private bundle; ecs.Image from a builder instance is captured when the
        # instance is created, before the bake has run. See docs/deploy/alicloud.md.
        r.fail(
            "boot",
            boot,
            "cold | baked on alicloud (no image build under `pulumi up` "
            "here: bake on a builder node and set `image` to the captured image with "
            "boot: baked)",
        )
        return None
    return boot


def _warm_pool(r: _Reader, cloud: str, mode: str | None) -> WarmPool | None:
    raw = r.structured("warm_pool", dict)
    if raw is None:
        return None
    enabled = r.boolean("warm_pool.enabled", raw.get("enabled", True))
    if not enabled:
        return None
    if cloud != "aws" or mode != "group":
        r.fail(
            "warm_pool",
            raw,
            "unset except on aws in mode: group (an Auto Scaling warm pool; "
            "ESS has no equivalent that keeps configured nodes stopped)",
        )
        return None
    lo = r.number("warm_pool.min_size", raw.get("min_size", 0), int, 0, 100, "an integer 0..100")
    hi = raw.get("max_prepared")
    if hi is not None:
        hi = r.number(
            "warm_pool.max_prepared",
            hi,
            int,
            1,
            100,
            "an integer 1..100: nodes in the group and the pool together",
        )
    if lo is None or (raw.get("max_prepared") is not None and hi is None):
        return None
    return WarmPool(min_size=lo, max_prepared=hi)


def _parse_days(r: _Reader, value: Any) -> tuple[str, ...]:
    allowed = "day names MON..SUN as a list, a range (MON-FRI) or a comma list"
    if value is None:
        return ("MON", "TUE", "WED", "THU", "FRI")
    items = value if isinstance(value, list) else str(value).split(",")
    days: set[str] = set()
    for item in items:
        item = str(item).strip().upper()
        if "-" in item:
            a, _, b = item.partition("-")
            if a not in DAYS or b not in DAYS:
                r.fail("schedule.days", value, allowed)
                return ()
            i, j = DAYS.index(a), DAYS.index(b)
            days.update(DAYS[(i + k) % 7] for k in range((j - i) % 7 + 1))
        elif item in DAYS:
            days.add(item)
        elif item:
            r.fail("schedule.days", value, allowed)
            return ()
    return tuple(d for d in DAYS if d in days)


def _schedule(r: _Reader) -> Schedule | None:
    raw = r.structured("schedule", dict)
    if raw is None:
        return None
    tz = raw.get("timezone", "UTC")
    try:
        ZoneInfo(str(tz))
    except (ZoneInfoNotFoundError, ValueError):
        r.fail("schedule.timezone", tz, "an IANA time zone such as Europe/Berlin or Asia/Shanghai")
        tz = None
    times = {}
    for key in ("start", "stop"):
        value = raw.get(key)
        m = _HHMM_RE.match(str(value)) if value is not None else None
        if not m:
            r.fail(f"schedule.{key}", value, "a local time HH:MM (24 h)")
        else:
            times[key] = time(int(m.group(1)), int(m.group(2)))
    days = _parse_days(r, raw.get("days"))
    if "days" in raw and not days and raw.get("days") is not None:
        r.fail("schedule.days", raw.get("days"), "at least one day: this schedule never starts")
    if len(times) == 2 and times["start"] == times["stop"]:
        r.fail(
            "schedule.stop",
            raw.get("stop"),
            "a time different from start: this schedule never runs the fleet",
        )
    if tz is None or len(times) != 2 or not days:
        return None
    return Schedule(timezone=tz, start=times["start"], stop=times["stop"], days=days)


def _ttl(r: _Reader, env: str | None, mode: str | None) -> float | None:
    value = r.get("ttl_hours")
    if value is None:
        if env == "dev":
            r.fail(
                "ttl_hours",
                None,
                f"hours (1..{MAX_TTL_HOURS}) after which a dev stack's nodes "
                "are released; dev stacks must expire",
            )
        return None
    if env == "prod":
        r.fail("ttl_hours", value, "unset in prod (a TTL would take production down)")
        return None
    return r.number(
        "ttl_hours",
        value,
        float,
        1,
        MAX_TTL_HOURS,
        f"a number of hours in 1..{MAX_TTL_HOURS} (Alibaba releases no sooner than "
        "30 minutes ahead)",
    )


def _cuda_profile(
    r: _Reader, matrix: Matrix, itype: InstanceType | None, distro: str | None
) -> str | None:
    """The profile, judged by the matrix's own rules (torchfleet_compat.matrix, as preflight and
    `check` judge a node): it must drive the instance type's GPU and, where the stack names the
    node's distro (not in mode: kubernetes, whose nodes run the runtime image), support that
    distro's Python. A stack that sets no profile gets the matrix's default where it fits; where
    it does not, one problem names the key to set and the profiles that fit both."""
    try:
        profile = matrix.profile(r.get("cuda_profile"), "cuda_profile")
    except compat.MatrixError:
        r.fail(
            "cuda_profile",
            r.get("cuda_profile"),
            "a profile of compat/matrix.yml: " + ", ".join(matrix.profiles),
        )
        return None
    misfits = _profile_misfits(matrix, profile, itype, distro)
    if misfits and r.get("cuda_profile") is None:
        fitting = [
            name
            for name, other in matrix.profiles.items()
            if not _profile_misfits(matrix, other, itype, distro)
        ]
        r.fail(
            "cuda_profile",
            None,
            f"set it: the default, {profile.name}, does not fit this stack ("
            + "; ".join(misfits)
            + f"); profiles that fit: {', '.join(fitting) or 'none'}",
        )
        return None
    for misfit in misfits:
        r.fail("cuda_profile", profile.name, misfit)
    return None if misfits else profile.name


def _profile_misfits(
    matrix: Matrix, profile: compat.Profile, itype: InstanceType | None, distro: str | None
) -> list[str]:
    """What is wrong with `profile` for this distro and instance type, as an allowed-values
    phrase each (empty: it fits)."""
    out = []
    if distro is not None:
        verdict = compat.python_verdict(matrix, profile, matrix.distros[distro].python)
        if not verdict.ok:
            out.append(
                f"a profile for {distro}'s Python {matrix.distros[distro].python} "
                f"({verdict.reason}): {', '.join(verdict.profiles)}; or an image_distro "
                f"{profile.name} supports: {', '.join(verdict.distros) or 'none'}"
            )
    if itype is not None:
        gpu = compat.resolve_gpu(matrix, declared_model=itype.gpu_model)
        verdict = compat.gpu_verdict(matrix, profile, gpu)
        if not verdict.ok:
            out.append(
                f"a profile that drives the {itype.gpu_model} of {itype.name} ({itype.gpu.arch}; "
                f"{verdict.reason}): {', '.join(verdict.profiles)}"
            )
    return out


def _vpc_cidr(r: _Reader, zones: int) -> str:
    value = r.get("vpc_cidr")
    try:
        net = ipaddress.ip_network(str(value))
        if net.version != 4 or not net.is_private or not 16 <= net.prefixlen <= 22:
            raise ValueError
    except ValueError:
        r.fail("vpc_cidr", value, "a private IPv4 network of /16../22 such as 10.42.0.0/16")
        return "10.42.0.0/16"
    return str(net)


def _tags(r: _Reader) -> dict[str, str]:
    raw = r.structured("tags", dict) or {}
    out = {}
    for k, v in raw.items():
        if k in RESERVED_TAGS or k.startswith(("aws:", "acs:", "aliyun")):
            r.fail(
                f"tags.{k}",
                v,
                f"a key other than the reserved {', '.join(RESERVED_TAGS)} "
                "and cloud prefixes (aws:, acs:, aliyun)",
            )
        elif not isinstance(v, (str, int, float)) or len(str(k)) > 64 or len(str(v)) > 128:
            r.fail(f"tags.{k}", v, "a string value (keys <= 64, values <= 128 chars)")
        else:
            out[str(k)] = str(v)
    return out


def _budget(r: _Reader, cloud: str) -> Budget | None:
    raw = r.structured("budget", dict)
    if raw is None:
        return None
    if cloud != "aws":
        r.fail(
            "budget",
            raw,
            "unset on alicloud (neither the provider nor the BSS OpenAPI can create a budget: "
            "create it in the Billing console; `torchfleet cost` reads the stack's spend)",
        )
        return None
    amount = raw.get("monthly_usd", "auto")
    if amount != "auto":
        amount = r.number("budget.monthly_usd", amount, float, 1, None, "auto | a USD amount >= 1")
    emails = raw.get("alert_emails") or []
    if not emails or not all(isinstance(e, str) and _EMAIL_RE.match(e) for e in emails):
        r.fail("budget.alert_emails", emails, "a non-empty list of e-mail addresses to alert")
    pct = r.number(
        "budget.threshold_percent",
        raw.get("threshold_percent", 80),
        int,
        1,
        1000,
        "an integer percentage 1..1000 of the budget",
    )
    return Budget(
        monthly_usd=None if amount == "auto" else amount,
        alert_emails=tuple(emails),
        threshold_percent=pct or 80,
    )


def _cross_checks(
    r: _Reader,
    cloud: str,
    env: str | None,
    mode: str | None,
    zones: tuple[str, ...],
    nodes: Nodes | None,
    spot: Spot | None,
    schedule: Schedule | None,
    client: tuple[str, ...],
) -> None:
    if mode == "group" and len(zones) < 2:
        r.fail(
            "zones",
            list(zones),
            "at least 2 zones in mode: group (the load balancer and the group span zones)",
        )
    if mode == "instances" and client:
        r.fail(
            "client_cidrs",
            list(client),
            "unset in mode: instances (there is no load "
            "balancer; reach nodes through SSH from admin_cidrs)",
        )
    if env == "dev" and schedule is None:
        r.fail(
            "schedule",
            None,
            "a working-hours schedule {timezone, start, stop, days}: dev "
            "stacks stop outside working hours",
        )
    if (
        cloud == "aws"
        and mode == "instances"
        and schedule is not None
        and spot is not None
        and spot.enabled
        and spot.interruption == "terminate"
    ):
        r.fail(
            "spot.interruption",
            spot.interruption,
            "stop | hibernate when a schedule stops "
            "spot instances (AWS stops only persistent spot requests that stop on interruption)",
        )
    if (
        mode in POOL_MODES
        and nodes is not None
        and spot is not None
        and spot.enabled
        and spot.on_demand_base > nodes.max
    ):
        r.fail("spot.on_demand_base", spot.on_demand_base, f"at most nodes.max ({nodes.max})")


def _fleet_checks(
    r: _Reader,
    image: Any,
    boot: str | None,
    nodes: Nodes | None,
    spot: Spot | None,
    warm_pool: WarmPool | None,
) -> None:
    if boot == "baked" and image == "auto":
        r.fail(
            "boot",
            boot,
            "cold | bake with image: auto (baked needs `image` set to an image a bake produced)",
        )
    if warm_pool is None:
        return
    if spot is not None and spot.enabled:
        r.fail(
            "warm_pool",
            "enabled",
            "unset with spot.enabled (AWS warm pools take no spot instances)",
        )
    if nodes is not None and warm_pool.min_size > nodes.max:
        r.fail("warm_pool.min_size", warm_pool.min_size, f"at most nodes.max ({nodes.max})")
    if (
        nodes is not None
        and warm_pool.max_prepared is not None
        and warm_pool.max_prepared < max(nodes.desired, warm_pool.min_size)
    ):
        r.fail(
            "warm_pool.max_prepared",
            warm_pool.max_prepared,
            f"at least nodes.desired and warm_pool.min_size "
            f"({max(nodes.desired, warm_pool.min_size)})",
        )


# -- mode: kubernetes ----------------------------------------------------------------------------


def _kubernetes(
    r: _Reader,
    cloud: str,
    mode: str | None,
    zones: tuple[str, ...],
    itypes: tuple[InstanceType, ...],
    nodes: Nodes | None,
    spot: Spot | None,
    image: Any,
    bucket: str | None,
) -> KubernetesSettings | None:
    """The `kubernetes` block (infra/k8s/settings.py holds its rules), only in that mode."""
    raw = r.structured("kubernetes", dict)
    if mode != "kubernetes":
        if raw is not None:
            r.fail("kubernetes", raw, "unset unless mode: kubernetes")
        return None
    return k8s_settings.parse(
        r,
        raw,
        cloud=cloud,
        zones=zones,
        gpus_per_node=itypes[0].gpu_count if itypes else None,
        nodes_max=nodes.max if nodes else None,
        node_image=image,
        spot_enabled=bool(spot and spot.enabled),
        spot_ratio=spot.max_price_ratio if spot else None,
        spot_percentage=spot.on_demand_percentage if spot else None,
        model_bucket=bucket,
    )


def raw_from_pulumi_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """Strip the namespace from a flat Pulumi config map; other namespaces are ignored."""
    prefix = NAMESPACE + ":"
    return {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--table"]:
        sys.exit("usage: python -m infra.config --table   (docs/configuration.md's table)")
    print(readme_table())
