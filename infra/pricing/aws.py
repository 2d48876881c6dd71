"""A region's prices from AWS: the Price List API (on-demand Linux prices and the fees of the
rest of the bill) and EC2's spot price history.

Contract: `quote(region, zones, types, now)` -> infra.pricing.quote.Quote in the partition's currency
(USD; CNY in the China regions, whose Price List endpoint is cn-northwest-1), or PricingError
naming the call that failed. Every call has short timeouts and no retries: a plan without a
network falls back at once. boto3 honours AWS_ENDPOINT_URL_PRICING / AWS_ENDPOINT_URL_EC2,
which is how the tests point it at a local fake Price List endpoint and at moto.

The Price List API answers product documents (JSON strings); one product per query here, whose
OnDemand term holds the price dimensions. `FEE_QUERIES` says which product each fee is and how
to pick its dimension (by unit; a product with tiers: the first tier).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import mean
from typing import Any

from infra.billing import AWS_TIMEOUTS
from infra.pricing.quote import PricingError, Quote, one_currency


class NotListed(PricingError):
    """The Price List answered, but has no such product in the region."""


TIMEOUTS = AWS_TIMEOUTS  # infra.billing: short timeouts, no retries, for every AWS read
SPOT_WINDOW = timedelta(hours=24)


def price_list_region(region: str) -> str:
    """The Price List API's endpoint region for a stack region."""
    return "cn-northwest-1" if region.startswith("cn-") else "us-east-1"


@dataclass(frozen=True)
class Query:
    service: str
    filters: Mapping[str, str]  # TERM_MATCH field -> value (regionCode is added)
    unit: str  # the price dimension's unit
    pick: Callable[[Mapping[str, Any]], bool] = lambda attrs: True  # among the products found
    per: float = 1.0  # the price is for this many units of the fee (an ALB's LCU: 1)


def _usage(suffix: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda attrs: str(attrs.get("usagetype", "")).endswith(suffix)


FEE_QUERIES: dict[str, Query] = {
    "nat_gateway_per_hour": Query(
        "AmazonEC2", {"productFamily": "NAT Gateway"}, "Hrs", _usage("NatGateway-Hours")
    ),
    "public_ipv4_per_hour": Query(
        "AmazonVPC",
        {"productFamily": "VPC Public IPv4 Address"},
        "Hrs",
        _usage("PublicIPv4:InUseAddress"),
    ),
    "disk_per_gb_month": Query(
        "AmazonEC2", {"productFamily": "Storage", "volumeApiName": "gp3"}, "GB-Mo"
    ),
    "load_balancer_per_hour": Query(
        "AWSELB",
        {"productFamily": "Load Balancer-Application"},
        "Hrs",
        _usage("LoadBalancerUsage"),
    ),
    "load_balancer_capacity_unit_per_hour": Query(
        "AWSELB", {"productFamily": "Load Balancer-Application"}, "LCU-Hrs", _usage("LCUUsage")
    ),
    "bucket_per_gb_month": Query(
        "AmazonS3",
        {"productFamily": "Storage", "volumeType": "Standard", "storageClass": "General Purpose"},
        "GB-Mo",
    ),
    "cluster_control_plane_per_hour": Query(
        "AmazonEKS", {"productFamily": "Compute"}, "Hrs", _usage("AmazonEKS-Hours:perCluster")
    ),
}


def instance_query(instance_type: str) -> Query:
    return Query(
        "AmazonEC2",
        {
            "instanceType": instance_type,
            "operatingSystem": "Linux",
            "tenancy": "Shared",
            "preInstalledSw": "NA",
            "capacitystatus": "Used",
            "licenseModel": "No License required",
        },
        "Hrs",
    )


def _dimensions(product: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    terms = product.get("terms", {}).get("OnDemand", {})
    return [d for term in terms.values() for d in term.get("priceDimensions", {}).values()]


def price_of(products: list[Mapping[str, Any]], query: Query, what: str) -> tuple[float, str]:
    """(amount, currency) of the first product the query picks: its dimension in `unit`, the
    first tier where there are tiers."""
    for product in products:
        if not query.pick(product.get("product", {}).get("attributes", {})):
            continue
        dims = [d for d in _dimensions(product) if d.get("unit") == query.unit]
        dims.sort(key=lambda d: float(d.get("beginRange", "0") or 0))
        for dim in dims:
            for currency, amount in dim.get("pricePerUnit", {}).items():
                if float(amount) > 0:
                    return float(amount) / query.per, currency
    raise NotListed(f"the Price List has no {query.unit} price for {what}")


def quote(region: str, zones: tuple[str, ...], types: tuple[str, ...], now: datetime) -> Quote:
    import boto3
    import botocore.config
    import botocore.exceptions

    config = botocore.config.Config(**TIMEOUTS)
    session = boto3.session.Session()
    endpoint = price_list_region(region)
    pricing = session.client("pricing", region_name=endpoint, config=config)

    def products(query: Query, what: str) -> list[Mapping[str, Any]]:
        filters = [
            {"Type": "TERM_MATCH", "Field": k, "Value": v}
            for k, v in {**query.filters, "regionCode": region}.items()
        ]
        try:
            reply = pricing.get_products(
                ServiceCode=query.service, Filters=filters, FormatVersion="aws_v1", MaxResults=100
            )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
            raise PricingError(f"pricing GetProducts ({what} in {region}): {err}") from None
        return [json.loads(p) if isinstance(p, str) else p for p in reply.get("PriceList", [])]

    on_demand, currencies = {}, set()
    for name in types:
        query = instance_query(name)
        on_demand[name], currency = price_of(products(query, name), query, f"{name} in {region}")
        currencies.add(currency)
    fees = {}
    for fee, query in FEE_QUERIES.items():
        try:
            fees[fee], currency = price_of(products(query, fee), query, f"{fee} in {region}")
        except NotListed:
            continue  # a product the region lacks: the reference figure stands in, if it can
        currencies.add(currency)
    return Quote(
        currency=one_currency(currencies, "the Price List"),
        on_demand=on_demand,
        spot=spot_prices(session, config, region, zones, types, now),
        fees=fees,
        source=f"AWS Price List API ({endpoint}) and EC2 spot price history",
        fetched=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def spot_prices(
    session: Any,
    config: Any,
    region: str,
    zones: tuple[str, ...],
    types: tuple[str, ...],
    now: datetime,
) -> dict[str, float]:
    """Per type the mean over the stack's zones of each zone's latest Linux spot price in the
    last day (types with no history here are left out: the estimate uses the family's ratio)."""
    import botocore.exceptions

    ec2 = session.client("ec2", region_name=region, config=config)
    latest: dict[tuple[str, str], tuple[str, float]] = {}
    try:
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=list(types),
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            StartTime=now - SPOT_WINDOW,
            EndTime=now,
        )
        for page in pages:
            for row in page.get("SpotPriceHistory", []):
                zone = row.get("AvailabilityZone", "")
                if zones and zone not in zones:
                    continue
                key, stamp = (row["InstanceType"], zone), str(row.get("Timestamp", ""))
                if key not in latest or stamp > latest[key][0]:
                    latest[key] = (stamp, float(row["SpotPrice"]))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as err:
        raise PricingError(f"ec2 DescribeSpotPriceHistory in {region}: {err}") from None
    out: dict[str, list[float]] = {}
    for (name, _), (_, price) in latest.items():
        out.setdefault(name, []).append(price)
    return {name: round(mean(prices), 6) for name, prices in out.items()}
