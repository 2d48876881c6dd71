"""Cost estimate of a stack: the whole bill, line by line, in the stack's currency.

Contract: `estimate(cfg, bundle_bytes=0)` is pure arithmetic on the stack's price book
(`cfg.book`: its region's own prices, or the reference table; infra.pricing) and returns a
`CostEstimate`:
- `lines`: every billed thing the stack makes, each with its price per hour while it runs, the
  hours a month it runs (730, or the working-hours schedule's for what the schedule stops) and
  whether it keeps billing after the TTL: the GPU nodes (spot at the cap; the typical column at
  the region's recent spot price or the family's long-run ratio), their root disks (a stopped
  instance keeps its disk), their public IPv4 addresses (AWS charges every one), the load
  balancer (hours, and capacity units from `scaling.requests_per_node`: one new connection per
  request, the worst case), its public addresses, the monitoring host with its disk, NAT gateway
  and address, a warm pool's stopped volumes, the node bundle's bucket, and in mode: kubernetes
  the control plane, the system nodes and the service's load balancer. Traffic and CloudWatch
  (the self-healing alarms, detailed monitoring) are not priced.
- the GPU nodes' summary at the steady size and at the scaling bounds (worst case: spot at the
  cap), the monthly totals (every line, so a schedule and a TTL count), the TTL's leftovers per
  day, and the fees the book has no price for in its currency (`unpriced`: such lines count 0).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from infra.config import StackConfig
from infra.pricing import as_output

HOURS_PER_MONTH = 730.0  # 365 * 24 / 12
WEEKS_PER_MONTH = 365.0 / 7 / 12
# A load balancer capacity unit serves 25 new connections a second (AWS ALB's definition; taken
# for Alibaba's CLB LCU too); every request is counted as a new connection: the worst case.
NEW_CONNECTIONS_PER_LCU = 25.0
GIB_PER_BYTE = 1 / (1 << 30)
# The bundle bucket keeps old bundle versions for infra.nodeboot.NONCURRENT_DAYS: about one old
# copy beside the current one.
BUNDLE_COPIES = 2


@dataclass(frozen=True)
class Line:
    item: str
    detail: str
    per_hour: float  # while it runs; GPU nodes: spot at the cap
    hours_per_month: float
    after_ttl: bool  # keeps billing once the TTL has released the GPU nodes
    typical_per_hour: float | None = None  # GPU nodes: spot at its typical price
    unpriced: bool = False  # no price in the stack's currency: counted as 0

    @property
    def per_month(self) -> float:
        return self.per_hour * self.hours_per_month

    @property
    def typical_per_month(self) -> float:
        rate = self.per_hour if self.typical_per_hour is None else self.typical_per_hour
        return rate * self.hours_per_month

    def as_dict(self) -> dict:
        return {**asdict(self), "per_month": round(self.per_month, 2)}


@dataclass(frozen=True)
class CostEstimate:
    instance_type: str
    nodes: int
    on_demand_nodes: int
    spot_nodes: int
    currency: str
    prices: dict  # infra.pricing.as_output: where the figures come from
    on_demand_per_hour: float  # every GPU node on-demand, plus the rest of the bill
    spot_cap_per_hour: float  # spot GPU nodes at their cap: the worst case we allow
    spot_typical_per_hour: float  # spot GPU nodes at their typical price
    hours_per_month: float  # the GPU nodes': 730, or the schedule's running hours
    monthly_on_demand_24x7: float
    monthly_worst_case: float  # the whole bill, schedule applied, spot at the cap
    monthly_typical: float  # the whole bill, schedule applied, typical spot prices
    min_nodes: int = 0
    max_nodes: int = 0
    spot_cap_per_hour_at_min: float = 0.0
    spot_cap_per_hour_at_max: float = 0.0
    monthly_worst_at_min: float = 0.0
    monthly_worst_at_max: float = 0.0
    warm_pool_per_month: float = 0.0  # stopped instances' root volumes, largest pool
    monitoring_instance_type: str = ""  # empty: no monitoring host
    monitoring_per_hour: float = 0.0  # instance, disk, NAT gateway and its address
    monitoring_per_month: float = 0.0
    gpu_nodes_per_month: float = 0.0  # the GPU nodes alone (worst case)
    rest_per_month: float = 0.0  # everything but the GPU nodes
    rest_per_hour: float = 0.0  # everything but the GPU nodes, while all of it runs
    after_ttl: list[str] = field(default_factory=list)  # what the TTL leaves billing
    after_ttl_per_day: float = 0.0
    unpriced: list[str] = field(default_factory=list)
    lines: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def split_nodes(cfg: StackConfig, size: int | None = None) -> tuple[int, int, int]:
    """(nodes, on-demand, spot) at `size` (default: the steady size): instances mode runs
    `nodes.count`, a group runs `nodes.desired` split like the group's instances distribution."""
    if cfg.mode == "instances":
        total = cfg.nodes.count
        return (total, 0, total) if cfg.market == "spot" else (total, total, 0)
    total = cfg.nodes.desired if size is None else size
    if not cfg.spot.enabled:
        return total, total, 0
    base = min(total, cfg.spot.on_demand_base)
    above = total - base
    on_demand = base + math.ceil(above * cfg.spot.on_demand_percentage / 100)
    return total, on_demand, total - on_demand


def bounds(cfg: StackConfig) -> tuple[int, int]:
    return (
        (cfg.nodes.count, cfg.nodes.count)
        if cfg.mode == "instances"
        else (cfg.nodes.min, cfg.nodes.max)
    )


def warm_pool_size(cfg: StackConfig) -> int:
    """The most stopped nodes the pool holds: with the group at its minimum, AWS keeps
    (max_prepared or max_size) - group size warm, and never fewer than min_size."""
    if cfg.warm_pool is None:
        return 0
    prepared = cfg.warm_pool.max_prepared or cfg.nodes.max
    return max(cfg.warm_pool.min_size, prepared - cfg.nodes.min)


def priced_types(cfg: StackConfig) -> tuple[str, ...]:
    """Every instance type the stack's bill names: what infra.pricing asks the cloud about."""
    names = [t.name for t in cfg.instance_types]
    if cfg.monitoring:
        names.append(cfg.monitoring.instance_type.name)
    if cfg.kubernetes:
        names.append(cfg.kubernetes.system.instance_type)
    return tuple(dict.fromkeys(names))


def gpu_hours(cfg: StackConfig) -> float:
    """Hours a month the GPU nodes run: the schedule's, else all of them."""
    return cfg.schedule.hours_per_week() * WEEKS_PER_MONTH if cfg.schedule else HOURS_PER_MONTH


class _Bill:
    """Collects lines priced from the stack's book."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.lines: list[Line] = []
        self.unpriced: list[str] = []

    def add(
        self,
        item: str,
        detail: str,
        fee: str | None,
        quantity: float,
        hours: float,
        after_ttl: bool,
        per_hour: float | None = None,
        typical: float | None = None,
        per_gb_month: bool = False,
    ) -> None:
        """A line of `quantity` x the book's `fee` (per hour, or per GB-month), or of an
        explicit `per_hour`."""
        unpriced = False
        if per_hour is None:
            price = self.cfg.book.fee(fee or "")
            if price is None:
                unpriced = True
                self.unpriced.append(f"{item} ({fee})")
                price = 0.0
            per_hour = quantity * price / (HOURS_PER_MONTH if per_gb_month else 1.0)
        self.lines.append(Line(item, detail, per_hour, hours, after_ttl, typical, unpriced))


def _lcus(cfg: StackConfig, nodes: int) -> float:
    if cfg.scaling is None:
        return 0.0
    requests_per_s = cfg.scaling.requests_per_node * nodes / 60
    return requests_per_s / NEW_CONNECTIONS_PER_LCU


def estimate(cfg: StackConfig, bundle_bytes: int = 0) -> CostEstimate:
    itype = cfg.instance_type
    price = cfg.on_demand_price(itype)
    nodes, od, spot = split_nodes(cfg)
    hours = gpu_hours(cfg)
    aws = cfg.cloud == "aws"
    dev_ttl = cfg.ttl_hours is not None

    def worst(on_demand: int, spots: int) -> float:
        return on_demand * price + spots * cfg.spot_cap(itype)

    bill = _Bill(cfg)
    cap = worst(od, spot)
    typical = od * price + spot * cfg.typical_spot_price(itype)
    bill.add(
        "GPU nodes",
        f"{nodes} x {itype.name} ({od} on-demand, {spot} spot at the cap)",
        None,
        nodes,
        hours,
        False,
        per_hour=cap,
        typical=typical,
    )
    # A stopped instance keeps its disk; a group scaled to zero deletes its nodes' disks.
    disk_hours = HOURS_PER_MONTH if cfg.mode == "instances" else hours
    disk = "gp3" if aws else "ESSD"
    bill.add(
        "root disks",
        f"{nodes} x {cfg.disk_gb} GiB {disk}",
        "disk_per_gb_month",
        nodes * cfg.disk_gb,
        disk_hours,
        False,
        per_gb_month=True,
    )
    if aws:  # every public IPv4 is billed; Alibaba's pay-by-traffic node addresses have no fee
        bill.add(
            "public IPv4 (nodes)",
            f"{nodes} x one per node while it runs",
            "public_ipv4_per_hour",
            nodes,
            hours,
            False,
        )
    if cfg.mode == "group":
        _load_balancer(bill, cfg, nodes, hours)
    if cfg.mode == "kubernetes":
        _cluster(bill, cfg)
    if cfg.warm_pool:
        size = warm_pool_size(cfg)
        bill.add(
            "warm pool volumes",
            f"{size} stopped x {cfg.disk_gb} GiB gp3",
            "disk_per_gb_month",
            size * cfg.disk_gb,
            HOURS_PER_MONTH,
            False,
            per_gb_month=True,
        )
    mon_lines = _monitoring(bill, cfg)
    if bundle_bytes:
        gib = bundle_bytes * BUNDLE_COPIES * GIB_PER_BYTE
        bill.add(
            "bundle bucket",
            f"{gib * 1024:.0f} MiB (the bundle and its previous version)",
            "bucket_per_gb_month",
            gib,
            HOURS_PER_MONTH,
            True,
            per_gb_month=True,
        )

    gpu_line, rest = bill.lines[0], bill.lines[1:]
    rest_h = sum(line.per_hour for line in rest)
    rest_month = sum(line.per_month for line in rest)
    lo, hi = bounds(cfg)
    at_min, at_max = worst(*split_nodes(cfg, lo)[1:]), worst(*split_nodes(cfg, hi)[1:])
    leftovers = [line for line in bill.lines if line.after_ttl] if dev_ttl else []
    return CostEstimate(
        instance_type=itype.name,
        nodes=nodes,
        on_demand_nodes=od,
        spot_nodes=spot,
        currency=cfg.currency,
        prices=as_output(cfg.book),
        on_demand_per_hour=round(nodes * price + rest_h, 4),
        spot_cap_per_hour=round(cap + rest_h, 4),
        spot_typical_per_hour=round(typical + rest_h, 4),
        hours_per_month=round(hours, 1),
        monthly_on_demand_24x7=round(nodes * price * HOURS_PER_MONTH + rest_month, 2),
        monthly_worst_case=round(gpu_line.per_month + rest_month, 2),
        monthly_typical=round(gpu_line.typical_per_month + rest_month, 2),
        min_nodes=lo,
        max_nodes=hi,
        spot_cap_per_hour_at_min=round(at_min + rest_h, 4),
        spot_cap_per_hour_at_max=round(at_max + rest_h, 4),
        monthly_worst_at_min=round(at_min * hours + rest_month, 2),
        monthly_worst_at_max=round(at_max * hours + rest_month, 2),
        warm_pool_per_month=round(
            sum(line.per_month for line in rest if line.item == "warm pool volumes"), 2
        ),
        monitoring_instance_type=cfg.monitoring.instance_type.name if cfg.monitoring else "",
        monitoring_per_hour=round(sum(line.per_hour for line in mon_lines), 4),
        monitoring_per_month=round(sum(line.per_month for line in mon_lines), 2),
        gpu_nodes_per_month=round(gpu_line.per_month, 2),
        rest_per_month=round(rest_month, 2),
        rest_per_hour=round(rest_h, 4),
        after_ttl=[f"{line.item}: {line.detail}" for line in leftovers],
        after_ttl_per_day=round(sum(line.per_hour for line in leftovers) * 24, 2),
        unpriced=bill.unpriced,
        lines=[line.as_dict() for line in bill.lines],
    )


def _load_balancer(bill: _Bill, cfg: StackConfig, nodes: int, hours: float) -> None:
    """Group mode: the ALB / CLB around the clock (the TTL and the schedules empty the group,
    not the load balancer), its capacity units while the nodes serve, its public addresses."""
    name = "ALB" if cfg.cloud == "aws" else "CLB (pay-by-LCU)"
    bill.add("load balancer", name, "load_balancer_per_hour", 1, HOURS_PER_MONTH, True)
    assert cfg.scaling is not None
    lcus = _lcus(cfg, nodes)
    bill.add(
        "load balancer capacity units",
        f"{lcus:.2f} LCU: {cfg.scaling.requests_per_node:g} requests/min x {nodes} node(s), "
        f"one new connection each",
        "load_balancer_capacity_unit_per_hour",
        lcus,
        hours,
        False,
    )
    if cfg.client_cidrs:  # internet-facing: AWS one address per zone, Alibaba one
        count = len(cfg.zones) if cfg.cloud == "aws" else 1
        bill.add(
            "public IPv4 (load balancer)",
            f"{count} x internet-facing",
            "public_ipv4_per_hour",
            count,
            HOURS_PER_MONTH,
            True,
        )


def _cluster(bill: _Bill, cfg: StackConfig) -> None:
    """mode: kubernetes: what runs until `pulumi destroy` whatever the GPU pool does."""
    k = cfg.kubernetes
    assert k is not None
    name = "EKS" if cfg.cloud == "aws" else "ACK Pro (API server CLB not included)"
    bill.add(
        "cluster control plane", name, "cluster_control_plane_per_hour", 1, HOURS_PER_MONTH, True
    )
    per_node = system_node_price(cfg)
    bill.add(
        "system nodes",
        f"{k.system.count} x {k.system.instance_type} on-demand",
        None,
        k.system.count,
        HOURS_PER_MONTH,
        True,
        per_hour=k.system.count * per_node,
    )
    bill.add(
        "system node disks",
        f"{k.system.count} x {cfg.disk_gb} GiB",
        "disk_per_gb_month",
        k.system.count * cfg.disk_gb,
        HOURS_PER_MONTH,
        True,
        per_gb_month=True,
    )
    if cfg.cloud == "aws":
        bill.add(
            "public IPv4 (system nodes)",
            f"{k.system.count} x one per node",
            "public_ipv4_per_hour",
            k.system.count,
            HOURS_PER_MONTH,
            True,
        )
    bill.add(
        "load balancer (the service's)",
        "made by the cloud controller for the runtime's Service; capacity units not estimated",
        "load_balancer_per_hour",
        1,
        HOURS_PER_MONTH,
        True,
    )


def system_node_price(cfg: StackConfig) -> float:
    """A system node's price: the region's own where it was read, else the configured one."""
    k = cfg.kubernetes
    assert k is not None
    book = cfg.book
    if book.origin != "reference" and k.system.instance_type in book.on_demand:
        return book.on_demand[k.system.instance_type]
    return k.system.usd_per_hour


def _monitoring(bill: _Bill, cfg: StackConfig) -> list[Line]:
    """The monitoring host, its disk, its NAT gateway and that gateway's address: all hours."""
    if cfg.monitoring is None:
        return []
    first = len(bill.lines)
    host = cfg.monitoring.instance_type
    bill.add(
        "monitoring host",
        host.name,
        None,
        1,
        HOURS_PER_MONTH,
        True,
        per_hour=cfg.on_demand_price(host),
    )
    bill.add(
        "monitoring disk",
        f"{cfg.monitoring.disk_gb} GiB",
        "disk_per_gb_month",
        cfg.monitoring.disk_gb,
        HOURS_PER_MONTH,
        True,
        per_gb_month=True,
    )
    bill.add(
        "NAT gateway",
        "the services subnet's egress",
        "nat_gateway_per_hour",
        1,
        HOURS_PER_MONTH,
        True,
    )
    bill.add(
        "public IPv4 (NAT gateway)",
        "its elastic IP",
        "public_ipv4_per_hour",
        1,
        HOURS_PER_MONTH,
        True,
    )
    return bill.lines[first:]
