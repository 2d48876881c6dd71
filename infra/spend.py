"""What a stack has cost, measured by the cloud's bill, next to what the estimate says for the same
hours (`torchfleet cost STACK --since 7d`). Reading the bill is infra.billing's (the monitoring
host's exporter runs the same code); this module adds the window, the credentials and the report.

- AWS: Cost Explorer `GetCostAndUsage` (daily, UnblendedCost) filtered by the `stack` tag every
  resource carries (infra.tags). Cost Explorer filters only by an ACTIVE cost-allocation tag:
  `up` activates `stack` through the API (`activate_stack_tag`), and AWS needs up to a day
  before the tag shows in the bill; spend from before that is not attributed to the stack.
  Cost Explorer's data lag up to a day, so the window ends at the start of today (UTC).
- Alibaba: BSS `DescribeInstanceBill` (alibabacloud-bssopenapi20171214), one call per day at
  daily granularity, paged; BSS has no tag filter there, so the lines whose instance tags carry
  `stack:<stack>` are summed (every labelled resource carries it: infra.tags). Its currency is
  the account's (CNY on the China site). ALICLOUD_BSS_ENDPOINT (a URL) overrides the endpoint
  (a local fake in the tests). BSS offers no budget with alerts through this API: an Alibaba
  stack has no budget (infra.config refuses the key there).

The estimate for the window is the stack's monthly figures (schedule applied: infra.cost) times
window hours / HOURS_PER_MONTH, typical and worst case; a stack created inside the window, or
stopped for part of it, bills less than that."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from typing import Any

from infra import billing
from infra.billing import STACK_TAG, Spend, ce_client, window
from infra.config import StackConfig
from infra.cost import HOURS_PER_MONTH, CostEstimate

__all__ = ["STACK_TAG", "Spend", "ce_client", "window"]  # infra.billing's, re-exported for the CLI
SINCE = re.compile(r"^(\d{1,3})([dw])$")
MAX_DAYS = 365  # Cost Explorer's history for daily granularity is 14 months; a year is plenty


class SpendError(ValueError):
    """A bad `--since` or no credentials to read the bill with: the operator's to fix before any
    call is made. `torchfleet cost` reports it as its preflight stage's error
    (infra.deploy.pipeline.spend_errors)."""


def parse_since(text: str) -> int:
    """`7d` / `2w` -> days; a clear error naming the value and what is allowed."""
    m = SINCE.match(text.strip())
    days = int(m.group(1)) * (7 if m.group(2) == "w" else 1) if m else 0
    if not 1 <= days <= MAX_DAYS:
        raise SpendError(
            f"--since = {text!r} is invalid; allowed: a number of days or weeks, 1d to "
            f"{MAX_DAYS}d (e.g. 7d, 2w)",
        )
    return days


def aws_spend(stack: str, start: date, end: date, client: Any = None) -> Spend:
    """The stack's spend on [start, end) from Cost Explorer (infra.billing)."""
    return billing.aws_spend(stack, start, end, client or ce_client())


def bss_client(region: str) -> Any:
    """BSS with the controller's access key (the one the Pulumi provider uses)."""
    import os
    from pathlib import Path

    from infra.credentials import alicloud_keys

    keys = alicloud_keys(os.environ, Path(os.environ.get("HOME") or Path.home()))
    if keys is None:
        raise SpendError("no Alibaba Cloud credentials for BSS")
    return billing.bss_client(keys.config(region, os.environ.get("ALICLOUD_BSS_ENDPOINT")))


def alicloud_spend(stack: str, region: str, start: date, end: date, client: Any = None) -> Spend:
    """The stack's spend on [start, end) from BSS's daily instance bill (infra.billing)."""
    return billing.alicloud_spend(stack, start, end, client or bss_client(region))


def activate_stack_tag(client: Any = None) -> str:
    """Activate the `stack` cost-allocation tag (idempotent) and say what happened; never
    raises: billing is not worth failing a deploy. AWS knows a tag key only once a tagged
    resource has been seen by billing (up to a day after the first one), so a first `up`
    usually gets "not found yet": the next `up` or `torchfleet cost` activates it."""
    try:
        answer = (client or ce_client()).update_cost_allocation_tags_status(
            CostAllocationTagsStatus=[{"TagKey": STACK_TAG, "Status": "Active"}]
        )
    except Exception as err:  # botocore's errors, no credentials, no network
        return f"cost allocation tag `{STACK_TAG}` not activated: {err}"
    if answer.get("Errors"):
        first = answer["Errors"][0]
        return (
            f"cost allocation tag `{STACK_TAG}` not activated yet ({first.get('Code')}: "
            f"{first.get('Message')}); billing sees a new tag up to a day after the first tagged "
            "resource: the next `torchfleet up` or `torchfleet cost` activates it"
        )
    return (
        f"cost allocation tag `{STACK_TAG}` active: Cost Explorer attributes spend to the stack "
        "within a day (`torchfleet cost` reads it)"
    )


@dataclass
class Comparison:
    hours: float
    typical: float  # the estimate for the window, typical spot prices
    worst: float  # at the spot cap
    currency: str


def estimate_for(est: CostEstimate, start: date, end: date) -> Comparison:
    hours = (end - start).days * 24.0
    share = hours / HOURS_PER_MONTH
    return Comparison(
        hours,
        round(est.monthly_typical * share, 2),
        round(est.monthly_worst_case * share, 2),
        est.currency,
    )


def lines(cfg: StackConfig, spend: Spend | None, cmp: Comparison, why_not: str = "") -> list[str]:
    """The report: measured, estimated for the same hours, and the difference."""
    head = f"{cfg.stack}: {cmp.hours / 24:g} day(s)"
    if spend is not None:
        head += f", {spend.start.isoformat()} to {spend.end.isoformat()} (UTC, end excluded)"
    out = [
        head,
        f"  estimated  {cmp.typical:10.2f} {cmp.currency} typical, {cmp.worst:.2f} at the spot "
        "cap (the whole bill for these hours, schedule applied: torchfleet plan)",
    ]
    if spend is None:
        out.append(f"  measured   not read: {why_not}")
        return out
    note = " (partly estimated by Cost Explorer: not final yet)" if spend.estimated else ""
    currency = spend.currency or cmp.currency  # no line billed: nothing says otherwise
    out.append(f"  measured   {spend.amount:10.2f} {currency} by tag {STACK_TAG}={cfg.stack}{note}")
    if currency != cmp.currency:
        out.append(
            f"  difference not computed: billed in {spend.currency}, estimated in {cmp.currency}"
        )
    elif cmp.typical > 0:
        diff = spend.amount - cmp.typical
        out.append(
            f"  difference {diff:+10.2f} {currency} ({100 * diff / cmp.typical:+.1f} % of "
            "the typical estimate)"
        )
    for day, amount in spend.per_day:
        out.append(f"    {day}  {amount:8.2f}")
    if spend.amount == 0:
        out.append(
            f"  no spend found by tag {STACK_TAG}"
            + (
                ": the tag must be an active cost-allocation tag (`torchfleet up` activates it; "
                "AWS takes up to a day), or the stack ran outside the window"
                if cfg.cloud == "aws"
                else ": the stack ran outside the window, or BSS has not billed it yet"
            )
        )
    return out
