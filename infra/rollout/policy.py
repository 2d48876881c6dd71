"""The rollout's decisions, pure (no I/O, no clock): tested one by one in tests/rollout.

Contract.
- `steps(strategy, given)`: the traffic shares (percent) a strategy walks through, ending at 100:
  canary 10,100; linear 25,50,75,100; all-at-once 100; `--steps` replaces them (increasing,
  1-100, ending at 100). `ab` (an A/B that holds): one share 1-99, `--steps` required; the
  engine holds it (no promotion) until `rollout abort` or a guard fires.
- `split(share, nodes)`: how many of `nodes` serve the candidate at `share` percent (at least
  one, and one stable node left below 100) and the integer HAProxy weights (1-256) that give
  that share; `Split.share` is the share those weights really give.
- `GuardSettings`: the guards' thresholds, validated with torchfleet_compat's problems collector
  (`guard_settings(raw)` names every bad key); defaults: candidate error ratio at most the
  stable's + 0.1 %, candidate p99 at most 1.2 x the stable's (and never judged on less than
  `min_p99_increase_s` of difference: a 1 ms p99 against 2 ms is noise, not a regression), a
  window needs `min_requests` candidate requests to count, shadow agreement at least 99 %, a
  candidate node's capacity (instances/s at its batch cap) at least 0.8 of a stable node's.
- `judge(stable, candidate, settings)`: the verdict on one window, the two versions' figures
  over the same seconds: `rollback` naming the guard that fired with the numbers (the capacity
  guard first: it needs no traffic), `wait` when the window holds too few candidate requests to
  judge, else `ok`.
- `p99_resolution(p99, bounds, settings)`: what the p99 guard can see at the stable's p99 when
  the p99s are read from a histogram with those bucket bounds: the smallest ratio it tells
  apart (torchfleet_compat.histogram.resolution), and a RolloutSettingsError naming
  max_p99_ratio when it is finer than that, unless `min_p99_increase_s` is at least that
  bucket's width (then the absolute floor decides there, not the ratio).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torchfleet_compat.histogram import resolution
from torchfleet_compat.problems import InvalidInput, Problems, sentence

from infra.rollout.errors import RolloutError

STRATEGIES: dict[str, tuple[int, ...]] = {
    "canary": (10, 100),
    "linear": (25, 50, 75, 100),
    "all-at-once": (100,),
}
MAX_WEIGHT = 256  # HAProxy's server weight range is 0-256
WEIGHT_TOTAL = 200  # the weights of one split add up to about this


class RolloutSettingsError(InvalidInput, RolloutError):
    heading = "rollout settings are invalid:"


# --- steps -----------------------------------------------------------------------------------


def parse_steps(text: str) -> tuple[int, ...]:
    """'10,50,100' -> (10, 50, 100); increasing whole percents 1-100 ending at 100."""
    found = Problems()
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        values = ()
    if (
        not values
        or values[-1] != 100
        or any(not 1 <= v <= 100 for v in values)
        or any(b <= a for a, b in zip(values, values[1:], strict=False))
    ):
        found.add("steps", text, "increasing percents 1-100 ending at 100, such as 10,50,100")
    found.raise_if_any(RolloutSettingsError)
    return values


AB = "ab"  # a fixed split held until aborted: no steps after it, no promotion


def steps(strategy: str, given: str | None = None) -> tuple[int, ...]:
    if strategy == AB:
        if not given or not given.strip().isdigit() or not 1 <= int(given) <= 99:
            raise RolloutSettingsError(
                sentence("steps", given, "one percent 1-99 with --strategy ab, such as 10")
            )
        return (int(given),)
    if strategy not in STRATEGIES:
        raise RolloutSettingsError(
            sentence("strategy", strategy, "one of " + ", ".join([*STRATEGIES, AB]))
        )
    return parse_steps(given) if given else STRATEGIES[strategy]


def parse_duration(key: str, text: str) -> float:
    """'90s', '5m', '1h', '30' (seconds) -> seconds; > 0."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*", str(text))
    seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)] if m else 0.0
    if seconds <= 0:
        found = Problems()
        found.add(key, text, "a duration > 0 such as 90s, 5m or 1h")
        found.raise_if_any(RolloutSettingsError)
    return seconds


# --- traffic split ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    candidates: int  # nodes serving the candidate
    candidate_weight: int  # HAProxy weight of each candidate node
    stable_weight: int  # of each stable node (0 when every node serves the candidate)
    share: float  # the candidate's share of requests these weights give, percent


def split(share: int, nodes: int) -> Split:
    if nodes < 1:
        raise ValueError("a rollout needs at least one node")
    if share >= 100 or nodes == 1:
        # one node cannot split traffic: it serves the candidate or the stable version
        return Split(nodes, 1, 0, 100.0) if share > 0 else Split(0, 0, 1, 0.0)
    k = min(nodes - 1, max(1, round(share * nodes / 100)))
    wc = max(1, min(MAX_WEIGHT, round(share / 100 * WEIGHT_TOTAL / k)))
    ws = max(1, min(MAX_WEIGHT, round((100 - share) / 100 * WEIGHT_TOTAL / (nodes - k))))
    real = 100 * k * wc / (k * wc + (nodes - k) * ws)
    return Split(k, wc, ws, round(real, 2))


# --- guards ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardSettings:
    max_error_ratio_increase: float = 0.001  # candidate error ratio <= stable's + this
    max_p99_ratio: float = 1.2  # candidate p99 <= this x stable's ...
    min_p99_increase_s: float = 0.025  # ... unless the two differ by less than this
    min_requests: int = 20  # candidate requests a window needs before it is judged
    min_shadow_agreement: float = 0.99  # shadow: argmax agreement at least this
    min_capacity_ratio: float = 0.8  # candidate instances/s per node at its cap >= this x stable's

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in GUARD_RULES}


# key -> (parse, check, allowed)
GUARD_RULES: dict[str, tuple[Any, Any, str]] = {
    "max_error_ratio_increase": (float, lambda v: 0 <= v <= 1, "a ratio in [0, 1]"),
    "max_p99_ratio": (float, lambda v: v >= 1, "a number >= 1"),
    "min_p99_increase_s": (float, lambda v: v >= 0, "seconds >= 0"),
    "min_requests": (int, lambda v: v >= 1, "an integer >= 1"),
    "min_shadow_agreement": (float, lambda v: 0 <= v <= 1, "a ratio in [0, 1]"),
    "min_capacity_ratio": (float, lambda v: 0 <= v <= 1, "a ratio in [0, 1]"),
}


def guard_settings(raw: dict[str, Any] | None, where: str = "") -> GuardSettings:
    """Settings from a mapping (a stack's torchfleet:rollout block, --guard KEY=VALUE flags);
    every bad key or value is named in one RolloutSettingsError."""
    found = Problems(where)
    values: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        rule = GUARD_RULES.get(key)
        if rule is None:
            found.add(key, value, "the keys " + ", ".join(GUARD_RULES))
            continue
        parse, check, allowed = rule
        try:
            parsed = parse(value)
            ok = not isinstance(value, bool) and check(parsed) and math.isfinite(parsed)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            found.add(key, value, allowed)
            continue
        values[key] = parsed
    found.raise_if_any(RolloutSettingsError)
    return GuardSettings(**values)


@dataclass(frozen=True)
class Figures:
    """One version's requests over one window: counts and the p99 in seconds (None: no data);
    what one of its nodes sustains (instances/s at its batch cap, the runtime's
    torchfleet_capacity_items_per_second, averaged over the version's nodes) and the lowest
    batch cap among them, where the source reads them."""

    version: str
    requests: float
    errors: float  # answered 5xx
    p99_s: float | None
    capacity: float | None = None
    batch_cap: int | None = None

    @property
    def error_ratio(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def text(self) -> str:
        p99 = "-" if self.p99_s is None else f"{self.p99_s * 1000:.1f} ms"
        text = f"{self.version}: {self.requests:.0f} req, {self.error_ratio * 100:.2f} % 5xx, p99 {p99}"
        if self.capacity is not None:
            text += f", {self.capacity:.0f}/s per node at cap {self.batch_cap}"
        return text

    def numbers(self) -> dict[str, Any]:
        out = {
            "requests": self.requests,
            "error_ratio": round(self.error_ratio, 6),
            "p99_s": self.p99_s,
        }
        if self.capacity is not None:
            out.update(capacity_items_per_s=round(self.capacity, 1), batch_cap=self.batch_cap)
        return out


@dataclass(frozen=True)
class Verdict:
    decision: str  # ok | wait | hold (figures not trusted: the split stays) | rollback
    guard: str = ""  # the guard that fired (rollback) or why it waits
    reason: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)


def judge(stable: Figures | None, cand: Figures, s: GuardSettings) -> Verdict:
    numbers: dict[str, Any] = {"candidate": cand.numbers()}
    if stable is not None:
        numbers["stable"] = stable.numbers()
    if (
        stable is not None
        and stable.capacity
        and cand.capacity is not None
        and cand.capacity < s.min_capacity_ratio * stable.capacity
    ):
        return Verdict(
            "rollback",
            "capacity",
            f"a candidate node sustains {cand.capacity:.0f} instances/s at batch cap "
            f"{cand.batch_cap}, {cand.capacity / stable.capacity:.2f} of a stable node's "
            f"{stable.capacity:.0f}/s at cap {stable.batch_cap} (< {s.min_capacity_ratio:g})",
            numbers,
        )
    if cand.requests < s.min_requests:
        return Verdict(
            "wait",
            "min_requests",
            f"{cand.requests:.0f} candidate requests in the window, fewer than {s.min_requests}",
            numbers,
        )
    base_errors = stable.error_ratio if stable is not None else 0.0
    limit = base_errors + s.max_error_ratio_increase
    if cand.error_ratio > limit:
        return Verdict(
            "rollback",
            "error_ratio",
            f"candidate error ratio {cand.error_ratio * 100:.2f} % > stable "
            f"{base_errors * 100:.2f} % + {s.max_error_ratio_increase * 100:.2f} %",
            numbers,
        )
    if stable is not None and stable.p99_s is not None and cand.p99_s is not None:
        bound = s.max_p99_ratio * stable.p99_s
        if cand.p99_s > bound and cand.p99_s - stable.p99_s > s.min_p99_increase_s:
            return Verdict(
                "rollback",
                "p99",
                f"candidate p99 {cand.p99_s * 1000:.1f} ms > {s.max_p99_ratio:g} x stable "
                f"{stable.p99_s * 1000:.1f} ms = {bound * 1000:.1f} ms",
                numbers,
            )
    return Verdict("ok", "", "within every guard", numbers)


@dataclass(frozen=True)
class Resolution:
    """What the p99 guard can see at the stable's p99: the bucket (lower, upper] holding it and
    the smallest ratio of two p99s those bounds tell apart."""

    p99_s: float
    lower_s: float
    upper_s: float
    ratio: float

    def text(self) -> str:
        bucket = f"{self.lower_s * 1000:g}-{self.upper_s * 1000:g} ms"
        seen = "none (the bucket is open-ended)" if math.isinf(self.ratio) else f"{self.ratio:g}"
        return (
            f"stable p99 {self.p99_s * 1000:.1f} ms, in the latency bucket {bucket}: the smallest "
            f"p99 ratio the guard can tell apart there is {seen}"
        )


def p99_resolution(p99_s: float, bounds: Sequence[float], s: GuardSettings) -> Resolution:
    """The resolution at the stable's p99 (see the module doc); RolloutSettingsError naming
    max_p99_ratio when the guard's threshold there is finer than the buckets."""
    finite = sorted(b for b in bounds if math.isfinite(b))
    upper = next((b for b in finite if p99_s <= b), math.inf)
    lower = max((b for b in finite if b < p99_s), default=0.0)
    seen = Resolution(p99_s, lower, upper, resolution(p99_s, finite))
    # an absolute floor as wide as the bucket decides there, whatever the ratio
    if s.max_p99_ratio < seen.ratio and s.min_p99_increase_s < upper - lower:
        raise RolloutSettingsError(
            sentence(
                "max_p99_ratio",
                s.max_p99_ratio,
                f"a ratio of at least {seen.ratio:g} here, or min_p99_increase_s of at least "
                f"{upper - lower:g} s (the bucket's width)",
                why=seen.text(),
            )
        )
    return seen


def judge_shadow(agreement: float | None, compared: float, s: GuardSettings) -> Verdict:
    """The shadow guard: the candidate's argmax agreement with the serving model."""
    numbers = {"compared_instances": compared, "argmax_agreement": agreement}
    if agreement is None or compared < s.min_requests:
        return Verdict("wait", "min_requests", f"{compared:.0f} instances compared", numbers)
    if agreement < s.min_shadow_agreement:
        return Verdict(
            "rollback",
            "shadow_agreement",
            f"argmax agreement {agreement * 100:.2f} % < {s.min_shadow_agreement * 100:.2f} %",
            numbers,
        )
    return Verdict("ok", "", "agrees", numbers)
