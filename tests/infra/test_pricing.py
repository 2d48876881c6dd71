"""A region's own prices (infra/pricing/): read through the clouds' real SDKs from local
endpoints, cached with their date, turned into the spot caps the stack registers, and the
reference table (with its source and date) whenever they cannot be had.

AWS: moto 5.2.5 serves EC2's spot price history; it has no Price List API (`pricing`), so a
local fake JSON endpoint (aws_json_fake.py) answers GetProducts through real boto3. Alibaba: the
local fake OpenAPI endpoint of tests/bootstrap/fake_alibaba.py (it verifies the SDK's ACS3
signature) answers DescribePrice and DescribeSpotPriceHistory to alibabacloud-ecs20140526."""

from __future__ import annotations

import math
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from infra import config, pricing
from infra.cost import estimate, priced_types
from infra.offline import run_offline
from infra.pricing.aws import instance_query

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the AWS JSON fake, importable by name
sys.path.insert(0, str(HERE.parent / "bootstrap"))  # the Alibaba fake
from aws_json_fake import FakeAwsJson, product  # noqa: E402
from fake_alibaba import ACCESS_KEY, SECRET, TOKEN, FakeAlibaba  # noqa: E402

NOW = datetime(2026, 3, 2, 10, 17, tzinfo=UTC)  # tests/infra/conftest.py's pinned clock
# eu-central-1 figures for the fake Price List (not the catalog's us-east-1 ones)
EU = {"g6.xlarge": 0.9776, "g6.2xlarge": 1.1905, "t3.medium": 0.048}
EU_FEES = {
    "nat_gateway_per_hour": 0.052,
    "public_ipv4_per_hour": 0.005,
    "disk_per_gb_month": 0.0952,
    "load_balancer_per_hour": 0.027,
    "load_balancer_capacity_unit_per_hour": 0.0095,
    "bucket_per_gb_month": 0.0245,
    "cluster_control_plane_per_hour": 0.10,
}


def price_list(region: str, currency: str = "USD", factor: float = 1.0) -> dict[str, list]:
    """The Price List products of `region` the stacks ask about, in `currency`."""
    ec2 = [
        product(
            "AmazonEC2",
            {**instance_query(name).filters, "regionCode": region},
            "Hrs",
            price * factor,
            currency,
        )
        for name, price in EU.items()
    ]
    # a Windows row of the same type, which the filters must leave out
    ec2.append(
        product(
            "AmazonEC2",
            {"instanceType": "g6.xlarge", "regionCode": region, "operatingSystem": "Windows"},
            "Hrs",
            9.99,
            currency,
        )
    )

    def fee(service, attrs, unit, key, tiers=None):
        return product(
            service, {**attrs, "regionCode": region}, unit, EU_FEES[key] * factor, currency, tiers
        )

    ec2 += [
        fee(
            "AmazonEC2",
            {"productFamily": "NAT Gateway", "usagetype": "EUC1-NatGateway-Hours"},
            "Hrs",
            "nat_gateway_per_hour",
        ),
        fee(
            "AmazonEC2",
            {
                "productFamily": "Storage",
                "volumeApiName": "gp3",
                "usagetype": "EUC1-EBS:VolumeUsage.gp3",
            },
            "GB-Mo",
            "disk_per_gb_month",
        ),
    ]
    elb = [
        fee(
            "AWSELB",
            {"productFamily": "Load Balancer-Application", "usagetype": f"EUC1-{use}"},
            unit,
            key,
        )
        for use, unit, key in (
            ("LoadBalancerUsage", "Hrs", "load_balancer_per_hour"),
            ("LCUUsage", "LCU-Hrs", "load_balancer_capacity_unit_per_hour"),
        )
    ]
    vpc = [
        fee(
            "AmazonVPC",
            {
                "productFamily": "VPC Public IPv4 Address",
                "usagetype": "EUC1-PublicIPv4:InUseAddress",
            },
            "Hrs",
            "public_ipv4_per_hour",
        ),
        product(  # the idle-address row, which the pick leaves out
            "AmazonVPC",
            {
                "productFamily": "VPC Public IPv4 Address",
                "usagetype": "EUC1-PublicIPv4:IdleAddress",
                "regionCode": region,
            },
            "Hrs",
            0.5,
            currency,
        ),
    ]
    s3 = [
        fee(
            "AmazonS3",
            {
                "productFamily": "Storage",
                "volumeType": "Standard",
                "storageClass": "General Purpose",
            },
            "GB-Mo",
            "bucket_per_gb_month",
            # tiered: the first 50 TB is the figure
            tiers=[("51200", 0.02 * factor), ("0", EU_FEES["bucket_per_gb_month"] * factor)],
        )
    ]
    eks = [
        fee(
            "AmazonEKS",
            {"productFamily": "Compute", "usagetype": "EUC1-AmazonEKS-Hours:perCluster"},
            "Hrs",
            "cluster_control_plane_per_hour",
        )
    ]
    return {"AmazonEC2": ec2, "AWSELB": elb, "AmazonVPC": vpc, "AmazonS3": s3, "AmazonEKS": eks}


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, tmp_path, moto_url):
    """AWS credentials in the environment, an empty HOME, EC2 at moto; returns a setter for
    the Price List endpoint."""
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto_url)
    monkeypatch.setenv(pricing.MODE_ENV, "auto")
    return lambda url: monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", url)


def refused_url() -> str:
    """A loopback port nothing listens on: the connection is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def aws_dev(settings, **overrides):
    raw = {**settings("aws-dev"), **overrides}
    return config.load(raw, "aws-dev")


def test_aws_reads_the_regions_own_prices_and_the_cap_follows_them(aws_env, tmp_path, settings):
    cfg = aws_dev(settings)
    with FakeAwsJson(price_list("eu-central-1")) as fake:
        aws_env(fake.url)
        book = pricing.resolve(
            "aws", cfg.region, cfg.zones, priced_types(cfg), now=NOW, cache_root=tmp_path
        )
    assert (book.origin, book.currency, book.region) == ("live", "USD", "eu-central-1")
    assert book.on_demand == {"g6.xlarge": EU["g6.xlarge"]}  # instances mode: one type
    assert book.fees == EU_FEES and book.unpriced == ()
    # the requests were what the Price List needs: the stack's region, Linux, shared tenancy
    asked = [b for t, b in fake.calls if b.get("ServiceCode") == "AmazonEC2"]
    g6 = next(
        b
        for b in asked
        if {"Field": "instanceType", "Type": "TERM_MATCH", "Value": "g6.xlarge"} in b["Filters"]
    )
    assert {f["Field"]: f["Value"] for f in g6["Filters"]}.items() >= {
        "regionCode": "eu-central-1",
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "capacitystatus": "Used",
    }.items()
    # moto's spot history (every zone offering the type; its price is 0.00001) for the typical
    assert book.spot["g6.xlarge"] == pytest.approx(0.00001)
    live = cfg.with_prices(book)
    # the cap is the ratio of the REGION's price, not of the us-east-1 reference
    assert live.spot_cap(live.instance_type) == math.floor(0.9776 * 0.9 * 10000) / 10000 == 0.8798
    assert cfg.spot_cap(cfg.instance_type) == math.floor(0.8048 * 0.9 * 10000) / 10000
    cost = estimate(live)
    assert cost.currency == "USD" and cost.prices["origin"] == "live"
    assert "eu-central-1's own prices in USD, read 2026-03-02" in cost.prices["source"]
    disks = next(line for line in cost.lines if line["item"] == "root disks")
    assert disks["per_hour"] == pytest.approx(100 * EU_FEES["disk_per_gb_month"] / 730)


def test_the_plan_registers_the_cap_of_the_regions_price(aws_env, settings, monkeypatch, tmp_path):
    monkeypatch.setattr(pricing, "CACHE_DIR", tmp_path)
    with FakeAwsJson(price_list("eu-central-1")) as fake:
        aws_env(fake.url)
        run = run_offline(
            "aws-dev", {f"torchfleet:{k}": v for k, v in settings("aws-dev").items()}, prices="auto"
        )
    (lt,) = run.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    spot = lt.inputs["instanceMarketOptions"]["spotOptions"]
    assert spot["maxPrice"] == "0.8798"
    assert run.outputs["cost"]["prices"]["origin"] == "live"


def test_a_china_region_is_priced_and_capped_in_cny(aws_env, tmp_path, settings):
    raw = {
        **settings("aws-dev"),
        "region": "cn-north-1",
        "zones": ["cn-north-1a", "cn-north-1b"],
        "budget": None,
    }
    cfg = config.load({k: v for k, v in raw.items() if v is not None}, "aws-dev")
    with FakeAwsJson(price_list("cn-north-1", "CNY", factor=7.5)) as fake:
        aws_env(fake.url)
        book = pricing.resolve(
            "aws", cfg.region, cfg.zones, priced_types(cfg), now=NOW, cache_root=tmp_path
        )
    assert (book.currency, book.unpriced) == ("CNY", ())
    live = cfg.with_prices(book)
    assert live.spot_cap(live.instance_type) == math.floor(0.9776 * 7.5 * 0.9 * 10000) / 10000
    assert estimate(live).currency == "CNY"


def test_the_quote_is_cached_with_its_date_and_asked_again_a_day_later(aws_env, tmp_path, settings):
    cfg = aws_dev(settings)
    types = priced_types(cfg)
    with FakeAwsJson(price_list("eu-central-1")) as fake:
        aws_env(fake.url)
        pricing.resolve("aws", cfg.region, cfg.zones, types, now=NOW, cache_root=tmp_path)
        asked = len(fake.calls)
        later = pricing.resolve(
            "aws", cfg.region, cfg.zones, types, now=NOW + timedelta(hours=5), cache_root=tmp_path
        )
        assert len(fake.calls) == asked  # the cache answered
        assert later.origin == "cache" and later.on_demand["g6.xlarge"] == EU["g6.xlarge"]
        assert "cached 2026-03-02 10:17" in later.describe()
        pricing.resolve(
            "aws", cfg.region, cfg.zones, types, now=NOW + timedelta(days=2), cache_root=tmp_path
        )
        assert len(fake.calls) == 2 * asked  # stale: asked again
    # the API gone: the stale quote stands in, and says why
    aws_env(refused_url())
    stale = pricing.resolve(
        "aws", cfg.region, cfg.zones, types, now=NOW + timedelta(days=5), cache_root=tmp_path
    )
    assert stale.origin == "cache" and "older than 24 h: the price API failed" in stale.describe()


def test_offline_and_failures_fall_back_to_the_reference_with_its_date(
    aws_env, tmp_path, settings, monkeypatch
):
    cfg = aws_dev(settings)
    types = priced_types(cfg)
    offline = pricing.resolve("aws", cfg.region, cfg.zones, types, "offline", cache_root=tmp_path)
    assert offline.origin == "reference" and offline.currency == "USD"
    assert offline.on_demand["g6.xlarge"] == 0.8048
    assert offline.describe() == (
        "reference table (AWS EC2 on-demand Linux price list, us-east-1, USD, 2024-06 (reference "
        "figures); Amazon EKS pricing, standard support, us-east-1, USD, 2026-03 (reference "
        "figure)); offline: no price API asked"
    )
    # an unreachable Price List endpoint: the reference, and the error named
    aws_env(refused_url())
    failed = pricing.resolve("aws", cfg.region, cfg.zones, types, now=NOW, cache_root=tmp_path)
    assert failed.origin == "reference"
    assert "the price API failed: pricing GetProducts (g6.xlarge in eu-central-1)" in failed.note
    # no credentials at all: nothing is asked
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    bare = pricing.resolve("aws", cfg.region, cfg.zones, types, now=NOW, cache_root=tmp_path)
    assert bare.note == "no aws credentials on this machine"
    assert not list(tmp_path.glob("*.json"))  # nothing was cached from failures


def test_a_type_the_price_list_lacks_makes_the_whole_quote_fall_back(aws_env, tmp_path, settings):
    cfg = aws_dev(settings)
    listing = price_list("eu-central-1")
    listing["AmazonEC2"] = [
        p
        for p in listing["AmazonEC2"]
        if p["product"]["attributes"].get("instanceType") != "g6.2xlarge"
    ]
    with FakeAwsJson(listing) as fake:
        aws_env(fake.url)
        book = pricing.resolve(
            "aws", cfg.region, cfg.zones, ("g6.xlarge", "g6.2xlarge"), now=NOW, cache_root=tmp_path
        )
    assert book.origin == "reference"
    assert "no Hrs price for g6.2xlarge in eu-central-1" in book.note


# -- Alibaba ------------------------------------------------------------------------------------

CNY = {"ecs.gn7i-c8g1.2xlarge": 12.873, "ecs.gn7i-c16g1.4xlarge": 15.36}


def ecs_prices(calls: list):
    def answer(action: str, params: dict[str, str]) -> dict:
        calls.append((action, params))
        if action == "DescribePrice" and params["ResourceType"] == "instance":
            price = CNY[params["InstanceType"]]
            return {
                "PriceInfo": {
                    "Price": {
                        "Currency": "CNY",
                        "TradePrice": price + 0.6,
                        "OriginalPrice": price + 0.6,
                        "DetailInfos": {
                            "DetailInfo": [
                                {"Resource": "instanceType", "TradePrice": price},
                                {"Resource": "systemDisk", "TradePrice": 0.6},
                            ]
                        },
                    }
                }
            }
        if action == "DescribePrice" and params["ResourceType"] == "disk":
            per_hour = 0.001 * int(params["DataDisk.1.Size"])
            return {
                "PriceInfo": {
                    "Price": {
                        "Currency": "CNY",
                        "TradePrice": per_hour,
                        "DetailInfos": {
                            "DetailInfo": [{"Resource": "dataDisk", "TradePrice": per_hour}]
                        },
                    }
                }
            }
        if action == "DescribeSpotPriceHistory":
            rows = [
                {
                    "ZoneId": zone,
                    "SpotPrice": price,
                    "Timestamp": stamp,
                    "InstanceType": params["InstanceType"],
                }
                for zone, price, stamp in (
                    ("cn-hangzhou-h", 9.0, "2026-03-02T08:00:00Z"),
                    ("cn-hangzhou-h", 4.0, "2026-03-02T09:00:00Z"),  # the latest of that zone
                    ("cn-hangzhou-i", 5.0, "2026-03-02T09:30:00Z"),
                    ("cn-hangzhou-k", 1.0, "2026-03-02T09:30:00Z"),  # not a zone of the stack
                )
            ]
            return {"Currency": "CNY", "SpotPrices": {"SpotPriceType": rows}}
        raise AssertionError(action)

    return answer


def alibaba_book(monkeypatch, cfg, tmp_path, answer):
    """resolve() of the stack's prices against the fake ECS endpoint: (book, refused calls)."""
    with FakeAlibaba(answer, region=cfg.region) as cloud:
        monkeypatch.setenv("ALICLOUD_ECS_ENDPOINT", cloud.url)
        types = priced_types(cfg)
        book = pricing.resolve(
            "alicloud", cfg.region, cfg.zones, types, "auto", now=NOW, cache_root=tmp_path
        )
        return book, cloud.refused


def test_alibaba_reads_cny_prices_through_the_sdk_and_caps_in_cny(monkeypatch, tmp_path, settings):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ALICLOUD_ACCESS_KEY", ACCESS_KEY)
    monkeypatch.setenv("ALICLOUD_SECRET_KEY", SECRET)
    monkeypatch.setenv("ALICLOUD_SECURITY_TOKEN", TOKEN)
    cfg = config.load(settings("alicloud-dev"), "alicloud-dev")
    calls: list = []
    book, refused = alibaba_book(monkeypatch, cfg, tmp_path, ecs_prices(calls))
    assert refused == []  # every call carried a valid ACS3 signature and the STS token
    assert (book.origin, book.currency) == ("live", "CNY")
    assert book.on_demand == {"ecs.gn7i-c8g1.2xlarge": 12.873}  # the instance, not its disk
    assert book.spot["ecs.gn7i-c8g1.2xlarge"] == pytest.approx(4.5)  # mean of the zones' latest
    assert book.fees["disk_per_gb_month"] == pytest.approx(0.001 * 730)
    # the fees no ECS API prices stay unpriced: the reference table is in USD
    assert set(book.unpriced) == {
        "nat_gateway_per_hour",
        "public_ipv4_per_hour",
        "load_balancer_per_hour",
        "load_balancer_capacity_unit_per_hour",
        "bucket_per_gb_month",
        "cluster_control_plane_per_hour",
    }
    price = dict(
        next(p for a, p in calls if a == "DescribePrice" and p["ResourceType"] == "instance")
    )
    assert price["RegionId"] == "cn-hangzhou" and price["PriceUnit"] == "Hour"
    live = cfg.with_prices(book)
    assert live.spot_cap(live.instance_type) == math.floor(12.873 * 0.8 * 1000) / 1000 == 10.298
    cost = estimate(live, bundle_bytes=2 << 20)
    assert cost.currency == "CNY"
    assert cost.unpriced == ["bundle bucket (bucket_per_gb_month)"]
    gpu = cost.lines[0]
    assert gpu["per_hour"] == pytest.approx(2 * 10.298)
    assert gpu["typical_per_hour"] == pytest.approx(2 * 4.5)


def test_alibaba_without_an_answer_falls_back_and_says_why(monkeypatch, tmp_path, settings):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ALICLOUD_ACCESS_KEY", ACCESS_KEY)
    monkeypatch.setenv("ALICLOUD_SECRET_KEY", "not-the-secret")
    cfg = config.load(settings("alicloud-dev"), "alicloud-dev")
    book, refused = alibaba_book(monkeypatch, cfg, tmp_path, ecs_prices([]))
    assert refused == ["SignatureDoesNotMatch"]
    assert book.origin == "reference" and "ECS DescribePrice in cn-hangzhou" in book.note
    assert book.describe().startswith("reference table (") and "2024-06" in book.describe()
