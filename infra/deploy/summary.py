"""What a stack is and costs now: the summary `up` ends with and `status` prints.

Cost per hour comes from the stack's `cost` output (infra.cost: the whole bill in the stack's
currency, from the region's own prices or the reference table, which the `prices` line names),
scaled by whether the working-hours schedule has the nodes running now; the TTL left from the
`ttl_expiry` output, and what the TTL leaves billing with its cost per day."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from infra.config import StackConfig
from infra.deploy.readiness import NodeState
from infra.deploy.smoke import Prediction
from infra.schedule import DAYS, Schedule, deploy_time


def in_working_hours(sched: Schedule, now: datetime) -> bool:
    """Whether `sched` has the fleet running at `now` (an overnight window belongs to the day it
    starts on)."""
    local = now.astimezone(sched.zone)
    day, t = DAYS[local.weekday()], local.time().replace(tzinfo=None)
    if not sched.overnight:
        return day in sched.days and sched.start <= t < sched.stop
    yesterday = DAYS[(local.weekday() - 1) % 7]
    return (day in sched.days and t >= sched.start) or (yesterday in sched.days and t < sched.stop)


def cost_now(
    cost: dict[str, Any] | None, cfg: StackConfig | None, now: datetime | None = None
) -> str:
    if not cost:
        return "unknown (the stack has no cost output)"
    if "spot_typical_per_hour" not in cost:
        return (
            "unknown (the stack's cost output predates the whole bill: `torchfleet up` rewrites it)"
        )
    now = now or deploy_time()
    cur = cost.get("currency", "USD")
    running = (
        f"{cost['nodes']} node(s): {cost['on_demand_nodes']} on-demand, {cost['spot_nodes']} spot"
    )
    if cfg and cfg.schedule and not in_working_hours(cfg.schedule, now):
        s = cfg.schedule
        return (
            f"{cost.get('rest_per_hour', 0.0):.3f} {cur}/h now (the rest of the bill): outside "
            f"working hours ({','.join(s.days)} {s.start:%H:%M}-{s.stop:%H:%M} {s.timezone}) "
            "the schedule stops the nodes; "
            f"{cost['spot_typical_per_hour']:.3f} {cur}/h typical while running"
        )
    return (
        f"{cost['spot_typical_per_hour']:.3f} {cur}/h typical, at most "
        f"{cost['spot_cap_per_hour']:.3f} {cur}/h ({running}; "
        f"{cost['on_demand_per_hour']:.3f} {cur}/h all on-demand; the whole bill)"
    )


def after_ttl(cost: dict[str, Any] | None) -> str | None:
    """What the TTL leaves billing and its cost per day (None without a TTL)."""
    if not cost or not cost.get("after_ttl"):
        return None
    return (
        f"{cost['after_ttl_per_day']:.2f} {cost['currency']}/day until `torchfleet down`: "
        + "; ".join(cost["after_ttl"])
    )


def ttl_left(expiry: str | None, now: datetime | None = None) -> str:
    if not expiry:
        return "none (the stack does not expire)"
    at = datetime.fromisoformat(expiry.replace("Z", "+00:00"))
    left = at - (now or datetime.now(UTC))
    if left.total_seconds() <= 0:
        return f"expired at {expiry}: the teardown schedule releases the nodes"
    hours, rest = divmod(int(left.total_seconds()), 3600)
    return f"{hours} h {rest // 60:02d} min left (expires {expiry}; every `up` extends it)"


@dataclass
class Summary:
    stack: str
    outputs: dict[str, Any]
    cfg: StackConfig | None = None
    nodes: list[NodeState] = field(default_factory=list)
    prediction: Prediction | None = None
    group: str | None = None
    pods: list[str] = field(default_factory=list)  # kubernetes: Deployments and the Service
    unready: list[str] = field(default_factory=list)  # what is not serving (status's exit code)
    artifacts: str | None = None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        o = self.outputs
        where = f" ({self.cfg.cloud} {self.cfg.region}, {self.cfg.mode} mode)" if self.cfg else ""
        out = [f"SUMMARY  stack {self.stack}{where}", f"  endpoint    {o.get('endpoint')}"]
        if o.get("ssh_tunnel"):
            out.append(f"  tunnel      {o['ssh_tunnel']}")
        if self.prediction:
            out.append(f"  prediction  {self.prediction.describe()}")
        width = max([len(n.host) for n in self.nodes] + [4])
        for i, n in enumerate(self.nodes):
            out.append(
                f"  {'nodes' if i == 0 else '':<10}  {n.host:<{width}}  {n.address:<15}  "
                f"{n.describe()}"
            )
        if self.group:
            out.append(f"  group       {self.group}")
        for i, line in enumerate(self.pods):
            out.append(f"  {'workload' if i == 0 else '':<10}  {line}")
        out.append(f"  cost now    {cost_now(o.get('cost'), self.cfg)}")
        if (o.get("cost") or {}).get("prices"):
            out.append(f"  prices      {o['cost']['prices']['source']}")
        out.append(f"  ttl         {ttl_left(o.get('ttl_expiry'))}")
        leftovers = after_ttl(o.get("cost"))
        if leftovers:
            out.append(f"  after ttl   {leftovers}")
        if self.artifacts:
            out.append(f"  run log     {self.artifacts}")
        out += [f"  {n}" for n in self.notes]
        return out
