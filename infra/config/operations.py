"""The operations section: who owns the stack and pays for it, when its nodes run and expire,
where its models come from, and the monitoring host.

Each key is one field of `Operations` (infra/config/keys.py says how a key is declared); the
sub-keys of `budget` and `monitoring` are the fields of their records, declared with `sub(...)`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import time
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from infra import catalog
from infra.config.keys import REQUIRED, integer, key, sub, switch
from infra.config.reader import Reader
from infra.schedule import DAYS, Schedule

MAX_TTL_HOURS = 24 * 30
RESERVED_TAGS = ("project", "stack", "env", "owner", "ttl-expiry", "torchfleet-role")
# The monitoring host's disk: 30 days of samples plus the nodes' journals (roles/monitoring:
# monitoring_logs_max_use 20G); its README sizes 50 GiB.
MONITORING_DISK_GB = (30, 16384)
MONITORING_DISK_DEFAULT_GB = 50
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_HHMM_RE = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


def _monthly_usd(r: Reader, path: str, value: Any, got: Mapping[str, Any]) -> Any:
    return value if value == "auto" else r.number(path, value, float, 1, None)


def _emails(r: Reader, path: str, value: Any, got: Mapping[str, Any]) -> tuple[str, ...] | None:
    emails = value or []
    if not emails or not all(isinstance(e, str) and _EMAIL_RE.match(e) for e in emails):
        r.fail(path, emails)
        return None
    return tuple(emails)


def _host_type(r: Reader, path: str, value: Any, got: Mapping[str, Any]) -> Any:
    cloud = got["cloud"]
    types = catalog.HOST_TYPES[cloud]
    itype = types.get(value) if isinstance(value, str) else None
    if itype is None:
        r.fail(path, value, f"a general-purpose {cloud} type: " + ", ".join(types))
    return itype


@dataclass(frozen=True, kw_only=True)
class Budget:
    monthly_usd: float | None = sub(  # None: derived from the cost estimate
        "number",
        "the monthly budget in USD (auto: the plan's cost estimate)",
        "auto | a USD amount >= 1",
        "auto",
        read=_monthly_usd,
    )
    alert_emails: tuple[str, ...] = sub(
        "list",
        "who is alerted",
        "a non-empty list of e-mail addresses to alert",
        (),
        read=_emails,
    )
    threshold_percent: int = sub(
        "integer",
        "the share of the budget that alerts",
        "an integer percentage 1..1000 of the budget",
        80,
        read=integer(1, 1000),
    )


@dataclass(frozen=True, kw_only=True)
class Monitoring:
    """The stack's monitoring host (roles/monitoring): Prometheus, Alertmanager and the
    journal receiver, in a private subnet of the stack's VPC."""

    instance_type: catalog.HostType = sub(
        "string",
        "the monitoring host's type",
        "a general-purpose type of the cloud (infra/catalog.py)",
        lambda got, subs: catalog.DEFAULT_HOST_TYPE[got["cloud"]],
        derived="the cloud's default host type (infra/catalog.py)",
        read=_host_type,
    )
    disk_gb: int = sub(
        "integer",
        "the monitoring host's disk",
        f"an integer number of GiB in {MONITORING_DISK_GB[0]}..{MONITORING_DISK_GB[1]} "
        "(30 days of samples plus the nodes' journals)",
        MONITORING_DISK_DEFAULT_GB,
        read=integer(*MONITORING_DISK_GB),
    )


WORKDAYS = "MON-FRI"  # a schedule's days when it names none


def _timezone(r: Reader, path: str, value: Any, got: Mapping[str, Any]) -> Any:
    try:
        ZoneInfo(str(value))
    except (ZoneInfoNotFoundError, ValueError):
        r.fail(path, value)
        return None
    return value


def _clock(r: Reader, path: str, value: Any, got: Mapping[str, Any]) -> time | None:
    m = _HHMM_RE.match(str(value)) if value is not None else None
    if not m:
        r.fail(path, value)
        return None
    return time(int(m.group(1)), int(m.group(2)))


def _days(r: Reader, path: str, value: Any, got: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Day names, ranges (wrapping past SUN) and comma lists; null: WORKDAYS."""
    items = WORKDAYS if value is None else value
    items = items if isinstance(items, list) else str(items).split(",")
    days: set[str] = set()
    for item in items:
        item = str(item).strip().upper()
        if "-" in item:
            a, _, b = item.partition("-")
            if a not in DAYS or b not in DAYS:
                r.fail(path, value)
                days = set()
                break
            i, j = DAYS.index(a), DAYS.index(b)
            days.update(DAYS[(i + k) % 7] for k in range((j - i) % 7 + 1))
        elif item in DAYS:
            days.add(item)
        elif item:
            r.fail(path, value)
            days = set()
            break
    if not days:
        r.fail(path, value, "at least one day: this schedule never starts")
        return None
    return tuple(d for d in DAYS if d in days)


@dataclass(frozen=True, kw_only=True)
class ScheduleKeys:
    """The `schedule` block's sub-keys, read into infra.schedule's Schedule (the record the
    program and the nodes use: it lives below infra/config, so it declares none; its fields and
    these are one list, tests/infra/test_config.py checks)."""

    timezone: str = sub(
        "string",
        "the clock the times are on",
        "an IANA time zone such as Europe/Berlin or Asia/Shanghai",
        "UTC",
        read=_timezone,
    )
    start: time = sub(
        "string", "when the fleet starts", "a local time HH:MM (24 h)", REQUIRED, read=_clock
    )
    stop: time = sub(
        "string", "when the fleet stops", "a local time HH:MM (24 h)", REQUIRED, read=_clock
    )
    days: tuple[str, ...] = sub(
        "list",
        "the days the fleet starts",
        "day names MON..SUN as a list, a range (MON-FRI) or a comma list",
        WORKDAYS,
        read=_days,
    )


def _schedule(r: Reader, got: Mapping[str, Any]) -> Schedule | None:
    raw = r.structured("schedule", dict)
    if raw is None:
        return None
    sub, bad = r.block("schedule", raw, got)
    if sub["start"] is not None and sub["start"] == sub["stop"]:
        r.fail(
            "schedule.stop",
            raw.get("stop"),
            "a time different from start: this schedule never runs the fleet",
        )
    return None if bad else Schedule(**sub)


def _ttl(r: Reader, got: Mapping[str, Any]) -> float | None:
    value, env = r.get("ttl_hours"), got["env"]
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


def _owner(r: Reader, got: Mapping[str, Any]) -> str | None:
    owner = r.get("owner")
    if not isinstance(owner, str) or not re.match(r"^[A-Za-z0-9._@+-]{1,64}$", owner):
        r.fail("owner", owner)
        return None
    return owner


def _tags(r: Reader, got: Mapping[str, Any]) -> dict[str, str]:
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


def _budget(r: Reader, got: Mapping[str, Any]) -> Budget | None:
    raw = r.structured("budget", dict)
    if raw is None:
        return None
    if got["cloud"] != "aws":
        r.fail(
            "budget",
            raw,
            "unset on alicloud (neither the provider nor the BSS OpenAPI can create a budget: "
            "create it in the Billing console; `torchfleet cost` reads the stack's spend)",
        )
        return None
    sub, bad = r.block("budget", raw, got)
    if bad:
        return None
    if sub["monthly_usd"] == "auto":
        sub["monthly_usd"] = None
    return Budget(**sub)


def _model_bucket(r: Reader, got: Mapping[str, Any]) -> str | None:
    bucket = r.get("model_bucket")
    if bucket is not None and (
        not isinstance(bucket, str) or not re.match(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", bucket)
    ):
        r.fail("model_bucket", bucket)
        return None
    return bucket


def _monitoring(r: Reader, got: Mapping[str, Any]) -> Monitoring | None:
    """The `monitoring` block; every sub-key is checked even while `enabled` is false."""
    raw = r.structured("monitoring", dict)
    if raw is None:
        return None
    sub, bad = r.block("monitoring", raw, got)
    if not sub.pop("enabled"):
        return None
    if got["mode"] == "kubernetes":
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
    return None if bad else Monitoring(**sub)


@dataclass(frozen=True, kw_only=True)
class Operations:
    schedule: Schedule | None = key(
        "mapping",
        "office hours: start and stop the fleet on a clock",
        "",
        record=ScheduleKeys,
        parse=_schedule,
    )
    ttl_hours: float | None = key(
        "number",
        "hours until the stack's resources are tagged to expire",
        f"1..{MAX_TTL_HOURS}",
        derived="required for dev instances, else unset",
        parse=_ttl,
    )
    owner: str = key(
        "string",
        "who pays for and answers for the stack",
        "letters, digits, . _ @ + - (1..64)",
        REQUIRED,
        parse=_owner,
    )
    tags: Mapping[str, str] = key(
        "mapping",
        "extra tags on every resource",
        "string keys and values, none of " + ", ".join(RESERVED_TAGS),
        {},
        parse=_tags,
    )
    budget: Budget | None = key(
        "mapping",
        "the monthly budget and who is alerted",
        "",
        record=Budget,
        parse=_budget,
    )
    model_bucket: str | None = key(
        "string",
        "the bucket nodes fetch models from",
        "an S3 / OSS bucket name (lowercase, 3..63 chars)",
        parse=_model_bucket,
    )
    monitoring: Monitoring | None = key(  # None: no monitoring host
        "mapping",
        "the stack's monitoring host",
        "",
        record=Monitoring,
        switch=switch("true: a monitoring host", False),
        parse=_monitoring,
    )
