"""Schedule dialects, TTL arithmetic and the catalog's agreement with compat/matrix.yml."""

from __future__ import annotations

from datetime import UTC, datetime, time

import pytest

from infra import catalog
from infra.matrix import load_matrix
from infra.schedule import (
    Schedule,
    ess_recurrence,
    eventbridge_cron,
    quartz_cron,
    ttl_expiry,
    unix_cron,
)

WEEKDAYS = ("MON", "TUE", "WED", "THU", "FRI")


def test_cron_dialects():
    at = time(8, 30)
    assert eventbridge_cron(at, WEEKDAYS) == "cron(30 8 ? * MON,TUE,WED,THU,FRI *)"
    assert unix_cron(at, ("SAT", "SUN")) == "30 8 * * 0,6"
    assert quartz_cron(at, ("MON",)) == "0 30 8 ? * MON"


def test_overnight_window_stops_the_next_day():
    s = Schedule("UTC", time(22, 0), time(6, 0), ("FRI",))
    assert s.overnight and s.stop_days == ("SAT",)
    assert s.hours_per_week() == 8


def test_ess_recurrence_crosses_midnight_into_utc():
    # 06:00 in Shanghai (UTC+8) is 22:00 UTC the day before: Mon-Fri becomes Sun-Thu
    s = Schedule("Asia/Shanghai", time(6, 0), time(20, 0), WEEKDAYS)
    now = datetime(2026, 3, 2, 10, 17, tzinfo=UTC)  # Monday 18:17 in Shanghai
    rec = ess_recurrence(s, s.start, s.days, now)
    assert rec.weekdays == "0,1,2,3,4"
    assert rec.launch_time == "2026-03-02T22:00Z"  # Tuesday 06:00 local, the next run
    rec = ess_recurrence(s, s.stop, s.days, now)
    assert rec.weekdays == "1,2,3,4,5" and rec.launch_time == "2026-03-02T12:00Z"  # 20:00 today


@pytest.mark.parametrize(
    "now,hours,expected",
    [
        ("2026-03-02T10:17:00", 8, "2026-03-02T19:00:00"),
        ("2026-03-02T10:00:00", 8, "2026-03-02T18:00:00"),
        ("2026-03-02T23:59:00", 1.5, "2026-03-03T01:30:00"),
    ],
)
def test_ttl_counts_from_the_next_full_hour(now, hours, expected):
    start = datetime.fromisoformat(now).replace(tzinfo=UTC)
    assert ttl_expiry(hours, start) == datetime.fromisoformat(expected).replace(tzinfo=UTC)


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
def test_catalog_agrees_with_the_matrix(cloud):
    matrix = load_matrix()
    types = catalog.instance_types(cloud).values()
    assert len(types) >= 15
    for t in types:
        assert t.gpu_model in matrix.gpus, t.name
        assert t.compute_capability == matrix.gpus[t.gpu_model].compute_capability
        assert t.gpu_memory_gib == matrix.gpus[t.gpu_model].memory_gib * t.gpu_count
        assert t.usd_per_hour > 0 and 0 < t.typical_spot_ratio < 1 and t.vcpu >= 4
        assert t.family in t.name
    assert catalog.PRICE_SOURCES[cloud] and "20" in catalog.PRICE_SOURCES[cloud]


def test_families_named_in_the_issue_are_present():
    aws = {t.family for t in catalog.instance_types("aws").values()}
    ali = {t.family for t in catalog.instance_types("alicloud").values()}
    assert {"g4dn", "g5", "g6", "p3", "p4d", "p5"} <= aws
    assert {"gn6i", "gn7i", "gn6v", "gn7"} <= ali


def test_by_gpu_is_cheapest_first_and_same_class_keeps_the_gpus():
    found = catalog.by_gpu("aws", "A10G", 1)
    prices = [t.usd_per_hour for t in found]
    assert prices == sorted(prices) and found[0].name == "g5.xlarge"
    siblings = catalog.same_class(catalog.lookup("aws", "g4dn.xlarge"))
    assert len(siblings) == 3
    assert {(t.gpu_model, t.gpu_count) for t in siblings} == {("T4", 1)}


def test_profiles_for_each_architecture():
    m = load_matrix()
    assert "cu116" in m.profiles_for("8.6") and "cu116" not in m.profiles_for("8.9")
    assert m.profiles_for("9.0") == ["cu118", "cu121"]
    assert "cpu" not in m.profiles_for("7.5")
