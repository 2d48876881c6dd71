"""A region's prices from Alibaba Cloud through its official SDK (alibabacloud-ecs20140526):
ECS DescribePrice (pay-as-you-go instance types and the ESSD system disk) and
DescribeSpotPriceHistory, in the account's own currency (CNY on the China site, USD on the
international one: the answers say which).

Contract: `quote(region, zones, types, now)` -> infra.pricing.quote.Quote, or PricingError naming
the call that failed. One try per call, short timeouts. ALICLOUD_ECS_ENDPOINT (a URL) overrides
the region's ECS endpoint (a local fake in the tests). The NAT gateway, CLB, EIP, OSS and ACK
fees have no ECS price API: they stay the reference table's figures where its currency is the
account's, and are reported unpriced where it is not (infra.pricing.book_from_quote).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from statistics import mean
from typing import Any

from infra.pricing.quote import PricingError, Quote, one_currency

HOURS_PER_MONTH = 730.0
SPOT_WINDOW = timedelta(hours=24)
DISK_CATEGORY, DISK_LEVEL, DISK_PROBE_GB = "cloud_essd", "PL1", 100


def client(region: str) -> Any:
    from alibabacloud_ecs20140526.client import Client

    from infra.credentials import alicloud_keys

    keys = alicloud_keys(os.environ, Path(os.environ.get("HOME") or Path.home()))
    if keys is None:
        raise PricingError("no Alibaba Cloud credentials")
    return Client(keys.config(region, os.environ.get("ALICLOUD_ECS_ENDPOINT")))


def _call(ecs: Any, action: str, request: dict[str, Any]) -> dict[str, Any]:
    from alibabacloud_ecs20140526 import models
    from darabonba.runtime import RuntimeOptions

    method = {
        "DescribePrice": "describe_price",
        "DescribeSpotPriceHistory": "describe_spot_price_history",
    }
    model = getattr(models, f"{action}Request")().from_map(request)
    runtime = RuntimeOptions(
        autoretry=False, max_attempts=1, connect_timeout=3000, read_timeout=6000
    )
    try:
        return getattr(ecs, f"{method[action]}_with_options")(model, runtime).body.to_map()
    except Exception as err:  # the SDK raises its own error types and the network's
        raise PricingError(f"ECS {action} in {request.get('RegionId')}: {err}") from None


def _trade(reply: dict[str, Any], resource: str) -> tuple[float, str]:
    price = reply.get("PriceInfo", {}).get("Price", {})
    for detail in price.get("DetailInfos", {}).get("DetailInfo", []):
        if detail.get("Resource") == resource:
            return float(detail["TradePrice"]), str(price["Currency"])
    if "TradePrice" not in price:
        raise PricingError(f"ECS DescribePrice answered no price for {resource}")
    return float(price["TradePrice"]), str(price["Currency"])


def quote(region: str, zones: tuple[str, ...], types: tuple[str, ...], now: datetime) -> Quote:
    ecs = client(region)
    on_demand, currencies = {}, set()
    for name in types:
        reply = _call(
            ecs,
            "DescribePrice",
            {
                "RegionId": region,
                "ResourceType": "instance",
                "InstanceType": name,
                "InstanceNetworkType": "vpc",
                "IoOptimized": "optimized",
                "PriceUnit": "Hour",
                "SystemDisk": {"Category": DISK_CATEGORY},
            },
        )
        on_demand[name], currency = _trade(reply, "instanceType")
        currencies.add(currency)
    disk = _call(
        ecs,
        "DescribePrice",
        {
            "RegionId": region,
            "ResourceType": "disk",
            "PriceUnit": "Hour",
            "DataDisk": [
                {"Category": DISK_CATEGORY, "Size": DISK_PROBE_GB, "PerformanceLevel": DISK_LEVEL}
            ],
        },
    )
    per_hour, currency = _trade(disk, "dataDisk")
    currencies.add(currency)
    return Quote(
        currency=one_currency(currencies, "ECS DescribePrice"),
        on_demand=on_demand,
        spot=spot_prices(ecs, region, zones, types, now),
        fees={"disk_per_gb_month": round(per_hour / DISK_PROBE_GB * HOURS_PER_MONTH, 6)},
        source="Alibaba Cloud ECS DescribePrice and DescribeSpotPriceHistory",
        fetched=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def spot_prices(
    ecs: Any, region: str, zones: tuple[str, ...], types: tuple[str, ...], now: datetime
) -> dict[str, float]:
    """Per type the mean over the stack's zones of each zone's latest spot price of the last
    day."""
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    out = {}
    for name in types:
        reply = _call(
            ecs,
            "DescribeSpotPriceHistory",
            {
                "RegionId": region,
                "NetworkType": "vpc",
                "InstanceType": name,
                "IoOptimized": "optimized",
                "OSType": "linux",
                "StartTime": (now - SPOT_WINDOW).strftime(stamp),
                "EndTime": now.strftime(stamp),
            },
        )
        latest: dict[str, tuple[str, float]] = {}
        for row in reply.get("SpotPrices", {}).get("SpotPriceType", []):
            zone = str(row.get("ZoneId", ""))
            if zones and zone not in zones:
                continue
            if zone not in latest or str(row.get("Timestamp", "")) > latest[zone][0]:
                latest[zone] = (str(row.get("Timestamp", "")), float(row["SpotPrice"]))
        if latest:
            out[name] = round(mean(p for _, p in latest.values()), 6)
    return out
