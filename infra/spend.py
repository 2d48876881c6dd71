"""What a stack has cost, measured by the cloud's bill, next to what the estimate says for the same
hours (`torchfleet cost STACK --since 7d`).

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
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from infra.config import StackConfig
from infra.cost import HOURS_PER_MONTH, CostEstimate
from infra.deploy.stage import StageError

STACK_TAG = "stack"  # infra.tags.base_tags: on every taggable resource
SINCE = re.compile(r"^(\d{1,3})([dw])$")
MAX_DAYS = 365  # Cost Explorer's history for daily granularity is 14 months; a year is plenty


def parse_since(text: str) -> int:
    """`7d` / `2w` -> days; a clear error naming the value and what is allowed."""
    m = SINCE.match(text.strip())
    days = int(m.group(1)) * (7 if m.group(2) == "w" else 1) if m else 0
    if not 1 <= days <= MAX_DAYS:
        raise StageError(
            "preflight",
            f"--since = {text!r} is invalid; allowed: a number of days or weeks, 1d to "
            f"{MAX_DAYS}d (e.g. 7d, 2w)",
        )
    return days


def window(days: int, today: date) -> tuple[date, date]:
    """[start, end): whole UTC days up to, not including, today (its costs are not in yet)."""
    return today - timedelta(days=days), today


@dataclass
class Spend:
    start: date
    end: date
    amount: float
    currency: str
    per_day: list[tuple[str, float]] = field(default_factory=list)
    estimated: bool = False  # Cost Explorer marks figures still being finalised


def ce_client() -> Any:
    """Cost Explorer (its one endpoint is us-east-1), short timeouts and no retries like the
    price reads (infra.pricing.aws): a billing call never holds up `up`."""
    import boto3
    import botocore.config

    from infra.pricing.aws import TIMEOUTS

    return boto3.client("ce", region_name="us-east-1", config=botocore.config.Config(**TIMEOUTS))


def aws_spend(stack: str, start: date, end: date, client: Any = None) -> Spend:
    """The stack's spend on [start, end) from Cost Explorer."""
    client = client or ce_client()
    kwargs: dict[str, Any] = {
        "TimePeriod": {"Start": start.isoformat(), "End": end.isoformat()},
        "Granularity": "DAILY",
        "Metrics": ["UnblendedCost"],
        "Filter": {"Tags": {"Key": STACK_TAG, "Values": [stack], "MatchOptions": ["EQUALS"]}},
    }
    days: list[tuple[str, float]] = []
    currencies: set[str] = set()
    estimated = False
    while True:
        page = client.get_cost_and_usage(**kwargs)
        for result in page.get("ResultsByTime", []):
            cost = result.get("Total", {}).get("UnblendedCost")
            if cost:
                days.append((result["TimePeriod"]["Start"], float(cost["Amount"])))
                currencies.add(cost["Unit"])
            estimated = estimated or bool(result.get("Estimated"))
        token = page.get("NextPageToken")
        if not token:
            break
        kwargs["NextPageToken"] = token
    if len(currencies) > 1:
        raise StageError("status", f"Cost Explorer answered in several currencies: {currencies}")
    return Spend(
        start,
        end,
        round(sum(a for _, a in days), 2),
        currencies.pop() if currencies else "USD",
        days,
        estimated,
    )


def bss_client(region: str) -> Any:
    import os
    from pathlib import Path

    from alibabacloud_bssopenapi20171214.client import Client

    from infra.credentials import alicloud_keys

    keys = alicloud_keys(os.environ, Path(os.environ.get("HOME") or Path.home()))
    if keys is None:
        raise StageError("preflight", "no Alibaba Cloud credentials for BSS")
    return Client(keys.config(region, os.environ.get("ALICLOUD_BSS_ENDPOINT")))


def _tagged(tags: str, stack: str) -> bool:
    """BSS's Tag field: `key:stack value:aws-dev; key:env value:dev` (the console's format)."""
    pairs = re.findall(r"key:(\S+) value:([^;]*)", tags or "")
    return (STACK_TAG, stack) in {(k.strip(), v.strip()) for k, v in pairs}


def alicloud_spend(stack: str, region: str, start: date, end: date, client: Any = None) -> Spend:
    """The stack's spend on [start, end) from BSS's daily instance bill."""
    from alibabacloud_bssopenapi20171214 import models
    from darabonba.runtime import RuntimeOptions

    bss = client or bss_client(region)
    runtime = RuntimeOptions(
        autoretry=False, max_attempts=1, connect_timeout=3000, read_timeout=10000
    )
    days: list[tuple[str, float]] = []
    currencies: set[str] = set()
    day = start
    while day < end:
        total, token = 0.0, None
        while True:
            request = models.DescribeInstanceBillRequest(
                billing_cycle=day.strftime("%Y-%m"),
                billing_date=day.isoformat(),
                granularity="DAILY",
                is_hide_zero_charge=True,
                max_results=300,
                next_token=token,
            )
            body = bss.describe_instance_bill_with_options(request, runtime).body.to_map()
            if not body.get("Success", True):
                raise StageError(
                    "status",
                    f"BSS DescribeInstanceBill {day}: {body.get('Code')} {body.get('Message')}",
                )
            data = body.get("Data") or {}
            for item in data.get("Items") or []:
                if _tagged(item.get("Tag", ""), stack):
                    total += float(item.get("PretaxAmount") or 0)
                    currencies.add(str(item.get("Currency") or "CNY"))
            token = data.get("NextToken")
            if not token:
                break
        days.append((day.isoformat(), round(total, 2)))
        day += timedelta(days=1)
    if len(currencies) > 1:
        raise StageError("status", f"BSS answered in several currencies: {currencies}")
    return Spend(
        start,
        end,
        round(sum(a for _, a in days), 2),
        currencies.pop() if currencies else "",
        days,
    )


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
