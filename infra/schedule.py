"""Working-hours schedules and TTL times, translated into each scheduler's dialect.

One `Schedule` (local start/stop times, days, IANA time zone) becomes: an EventBridge Scheduler
cron (AWS instances), a Unix cron for Auto Scaling scheduled actions (AWS groups), a Quartz-style
cron for OOS (Alibaba instances) and UTC launch times with weekly recurrences for ESS scheduled
tasks (Alibaba groups, which take no time zone).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

DAYS = ("MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN")
# Unix cron and ESS count Sunday as 0.
_UNIX_DAY = {d: (i + 1) % 7 for i, d in enumerate(DAYS)}


@dataclass(frozen=True)
class Schedule:
    timezone: str
    start: time
    stop: time
    days: tuple[str, ...]

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def overnight(self) -> bool:
        return self.stop <= self.start

    @property
    def stop_days(self) -> tuple[str, ...]:
        """A window that crosses midnight stops on the day after it started."""
        return shift_days(self.days, 1) if self.overnight else self.days

    def hours_per_day(self) -> float:
        start = self.start.hour * 60 + self.start.minute
        stop = self.stop.hour * 60 + self.stop.minute
        return ((stop - start) % (24 * 60)) / 60

    def hours_per_week(self) -> float:
        return self.hours_per_day() * len(self.days)


def shift_days(days: tuple[str, ...], offset: int) -> tuple[str, ...]:
    shifted = {DAYS[(DAYS.index(d) + offset) % 7] for d in days}
    return tuple(d for d in DAYS if d in shifted)


# -- clock ----------------------------------------------------------------------------------------


def deploy_time() -> datetime:
    """Now, in UTC. TORCHFLEET_NOW (ISO 8601) pins it so plans and tests are reproducible."""
    pinned = os.environ.get("TORCHFLEET_NOW")
    if pinned:
        value = datetime.fromisoformat(pinned.replace("Z", "+00:00"))
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.now(UTC)


def ttl_expiry(hours: float, now: datetime | None = None) -> datetime:
    """The TTL runs from the next full hour after this deploy: re-running `pulumi up` within the
    same hour changes nothing, a later deploy extends the stack's life (it is "TTL since the last
    deploy", which is what a dev stack in use wants)."""
    now = now or deploy_time()
    base = now.replace(minute=0, second=0, microsecond=0)
    if base < now:
        base += timedelta(hours=1)
    return base + timedelta(minutes=math.ceil(hours * 60))


def iso_utc(value: datetime, seconds: bool = True) -> str:
    fmt = "%Y-%m-%dT%H:%M:%SZ" if seconds else "%Y-%m-%dT%H:%MZ"
    return value.astimezone(UTC).strftime(fmt)


# -- dialects -------------------------------------------------------------------------------------


def _numbers(days: tuple[str, ...]) -> str:
    return ",".join(str(n) for n in sorted(_UNIX_DAY[d] for d in days))


def eventbridge_cron(at: time, days: tuple[str, ...]) -> str:
    """EventBridge Scheduler: cron(minutes hours day-of-month month day-of-week year)."""
    return f"cron({at.minute} {at.hour} ? * {','.join(days)} *)"


def unix_cron(at: time, days: tuple[str, ...]) -> str:
    """Auto Scaling scheduled actions take a Unix cron (Sunday = 0)."""
    return f"{at.minute} {at.hour} * * {_numbers(days)}"


def quartz_cron(at: time, days: tuple[str, ...]) -> str:
    """OOS timer triggers: seconds minutes hours day-of-month month day-of-week."""
    return f"0 {at.minute} {at.hour} ? * {','.join(days)}"


@dataclass(frozen=True)
class UtcRecurrence:
    """An ESS weekly recurrence: first launch (UTC) and the UTC weekdays (Sunday = 0)."""

    launch_time: str
    weekdays: str


def ess_recurrence(
    sched: Schedule, at: time, days: tuple[str, ...], now: datetime
) -> UtcRecurrence:
    """ESS takes UTC only, so the local time is converted with the zone's offset at `now` (a DST
    change shifts the action by an hour until the next deploy) and the weekdays move with it when
    the conversion crosses midnight."""
    local_now = now.astimezone(sched.zone)
    first = None
    for ahead in range(8):
        day = (local_now + timedelta(days=ahead)).date()
        candidate = datetime.combine(day, at, tzinfo=sched.zone)
        if DAYS[candidate.weekday()] in days and candidate > local_now:
            first = candidate
            break
    assert first is not None, "a schedule with at least one day always has a next run"
    utc = first.astimezone(UTC)
    offset = (utc.date() - first.date()).days
    utc_days = shift_days(days, offset)
    return UtcRecurrence(
        launch_time=iso_utc(utc, seconds=False),
        weekdays=_numbers(utc_days),
    )
