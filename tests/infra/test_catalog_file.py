"""compat/catalog.yml through its loader (infra/catalog.py): the committed file parses into what
the stacks use, every price carries its source, region, currency and date, and a broken file is
refused with every problem named (file, key, value, what is allowed) in one pass."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from infra import catalog, config
from infra.catalog import CatalogError


def committed() -> dict[str, Any]:
    return yaml.safe_load(catalog.CATALOG_FILE.read_text())


def problems(data: Any) -> list[str]:
    with pytest.raises(CatalogError) as err:
        catalog.parse(data, "catalog.yml")
    assert str(err.value) == "\n".join(err.value.problems)
    return err.value.problems


def test_the_committed_file_is_what_the_module_serves():
    cat = catalog.read(catalog.CATALOG_FILE)
    assert cat == catalog.load()
    assert set(cat.instance_types) == set(config.CLOUDS) == set(catalog.CATALOG)
    assert catalog.CATALOG["aws"]["g6.xlarge"].usd_per_hour == 0.8048
    assert catalog.CATALOG["alicloud"]["ecs.gn7i-c8g1.2xlarge"].typical_spot_ratio == 0.35
    assert catalog.HOST_TYPES["aws"][catalog.DEFAULT_HOST_TYPE["aws"]].name == "t3.medium"
    assert (
        set(catalog.FEE_PRICES["aws"]) == set(catalog.FEE_PRICES["alicloud"]) == set(catalog.FEES)
    )
    assert catalog.FEE_PRICES["aws"]["nat_gateway_per_hour"].amount == 0.045
    assert catalog.FEE_PRICES["aws"]["disk_per_gb_month"].amount == 0.08
    # AWS's recover action serves EBS-only types: the NVMe families say so
    stores = {n: t.instance_store for n, t in catalog.CATALOG["aws"].items()}
    assert {n.split(".")[0] for n, s in stores.items() if not s} == {"p3"}
    assert not any(t.instance_store for t in catalog.HOST_TYPES["aws"].values())


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
def test_every_price_says_where_it_comes_from(cloud):
    prices = catalog.load().prices(cloud)
    fees = len(catalog.FEES)
    assert len(prices) == len(catalog.CATALOG[cloud]) + len(catalog.HOST_TYPES[cloud]) + fees
    for p in prices:
        assert p.currency == "USD" and p.region == {"aws": "us-east-1"}.get(cloud, "ap-southeast-1")
        assert p.source.title and p.date.startswith("20")
        assert p.describe() in catalog.PRICE_SOURCES[cloud]
    # the price list, and the managed cluster's own page for its control plane
    assert {p.source.key for p in prices} >= {f"{cloud}-price-list"}
    assert len({p.source.key for p in prices}) == 2


def test_a_broken_row_is_refused_naming_the_row_key_value_and_allowed():
    data = committed()
    rows = data["clouds"]["aws"]["instance_types"]
    assert rows[0]["type"] == "g4dn.xlarge"
    rows[0].update(gpu="T5", on_demand=-1, currency="CNY", date=202406)
    del rows[1]["vcpu"]
    rows[2]["colour"] = "blue"
    got = problems(data)
    where = "catalog.yml: clouds.aws.instance_types"
    assert got == [
        f"{where}[0] (g4dn.xlarge).gpu = 'T5' is invalid; allowed: "
        + " | ".join(catalog.load_matrix().gpus),
        f"{where}[0] (g4dn.xlarge).on_demand = -1 is invalid; allowed: a number > 0",
        f"{where}[0] (g4dn.xlarge).currency = 'CNY' is invalid; allowed: USD",
        f'{where}[0] (g4dn.xlarge).date = 202406 is invalid; allowed: a date "YYYY", "YYYY-MM" '
        'or "YYYY-MM-DD" in quotes (YAML reads an unquoted date as a date or a number)',
        f"{where}[1] (g4dn.2xlarge).vcpu = '(missing)' is invalid; allowed: a value: each "
        "entry has type, family, gpu, gpus, vcpu, ram_gib, instance_store, on_demand, currency, "
        "region, source, date",
        f"{where}[2] (g4dn.4xlarge).colour = 'blue' is invalid; allowed: the keys type, family, "
        "gpu, gpus, vcpu, ram_gib, instance_store, on_demand, currency, region, source, date",
    ]


def test_cross_references_are_checked():
    data = committed()
    aws = data["clouds"]["aws"]
    aws["instance_types"][0]["family"] = "g9"
    aws["instance_types"][1]["type"] = "g4dn.xlarge"  # listed twice
    aws["host_types"][0]["source"] = "a-blog"
    aws["default_host_type"] = "t2.nano"
    del aws["fees"]["disk_per_gb_month"]
    data["format"] = 1
    got = problems(data)
    assert got[0] == "catalog.yml: format = 1 is invalid; allowed: 2 (what this loader reads)"
    assert any(
        p.startswith("catalog.yml: clouds.aws.instance_types[0] (g4dn.xlarge).family = 'g9' ")
        and p.endswith("allowed: g4dn | g5 | g6 | p3 | p4d | p5")
        for p in got
    )
    assert (
        "catalog.yml: clouds.aws.instance_types[1] (g4dn.xlarge).type = 'g4dn.xlarge' is "
        "invalid; allowed: a type not listed before in clouds.aws" in got
    )
    assert any("host_types[0] (t3.medium).source = 'a-blog'" in p for p in got)
    assert (
        "catalog.yml: clouds.aws.default_host_type = 't2.nano' is invalid; allowed: "
        "t3.medium | t3.large | m6i.large | m6i.xlarge" in got
    )
    assert (
        "catalog.yml: clouds.aws.fees.disk_per_gb_month = '(missing)' is invalid; allowed: a "
        "value: each entry has " + ", ".join(catalog.FEES) in got
    )
    assert len(got) == 6


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.update(clouds=[]), "clouds = [] is invalid"),
        (lambda d: d.pop("sources"), "sources = '(missing)' is invalid"),
        (
            lambda d: d["clouds"]["alicloud"]["families"]["gn7"].update(typical_spot_ratio=1.5),
            "clouds.alicloud.families.gn7.typical_spot_ratio = 1.5 is invalid; allowed: a "
            "number in (0, 1]",
        ),
        (
            lambda d: d["clouds"]["alicloud"]["fees"]["nat_gateway_per_hour"].update(
                region="Singapore"
            ),
            "clouds.alicloud.fees.nat_gateway_per_hour.region = 'Singapore' is invalid; "
            "allowed: a region name",
        ),
        (
            lambda d: d["clouds"]["aws"]["host_types"][0].update(vcpu=True),
            "clouds.aws.host_types[0] (t3.medium).vcpu = True is invalid; allowed: an integer",
        ),
        (
            lambda d: d["clouds"]["aws"].update(host_types=5),
            "clouds.aws.host_types = 5 is invalid; allowed: a non-empty list of mappings",
        ),
        (
            lambda d: d["clouds"]["aws"]["instance_types"][3].update(type=["g4dn.xlarge"]),
            "clouds.aws.instance_types[3].type = ['g4dn.xlarge'] is invalid; allowed: an "
            "instance type name",
        ),
        (
            lambda d: d["clouds"].update(AWS=d["clouds"].pop("aws")),
            "clouds.AWS = 'AWS' is invalid; allowed: a cloud name",
        ),
    ],
)
def test_each_kind_of_mistake_is_named(edit, expected):
    data = committed()
    edit(data)
    assert any(expected in p for p in problems(data)), problems(data)


def test_a_file_that_is_not_yaml_names_the_file(tmp_path):
    path = tmp_path / "catalog.yml"
    path.write_text("format: 2\nsources: [unclosed\n")
    with pytest.raises(CatalogError, match=f"^{path}: cannot be read as YAML"):
        catalog.read(path)
    path.write_text(yaml.safe_dump(copy.deepcopy(committed())))
    assert catalog.read(path).instance_types == catalog.load().instance_types
