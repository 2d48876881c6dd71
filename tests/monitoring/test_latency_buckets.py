"""The role's latency rules on the runtime's real latency buckets (torchfleet_compat.histogram's
LATENCY_BOUNDS, every bound, as a node exposes them), under Debian's promtool: a unit test file
generated from the bounds, so it follows them when they change.

Two model versions on two instances, the candidate's requests 1.2x the stable's (105-125 ms
against 126-150 ms): the per-version p99 rule (what the rollout's PrometheusSource reads) tells
them apart by about that ratio, and equals torchfleet_compat's quantile over the same counts
(the rule the runtime, the node agent and the rollout's scrape share); the per-version capacity
rule averages each version's nodes. The latency-spike
alert's comparison (a node's 5-minute p99 against a day earlier) sees a 1.35x rise on the new
buckets and the alert fires; on the old ones both days read the same in the 100-250 ms bucket."""

from __future__ import annotations

import math
from pathlib import Path

import yaml
from monitoring_support import RULE_FILES, promtool_test
from torchfleet_compat.histogram import LATENCY_BOUNDS, quantile

OLD_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PER_MINUTE = 200  # requests
STABLE = [0.105 + 0.02 * i / PER_MINUTE for i in range(PER_MINUTE)]  # 105-125 ms
SLOWER = [x * 1.2 for x in STABLE]
# A reading moves in steps of about one bucket: on requests this alike (all within 20 ms) a 1.2x
# rise reads 1.185x, under the alert's 1.2x; a 1.35x one reads past it. Inside the old 100-250 ms
# bucket both read 1.0x.
SPIKE = [x * 1.35 for x in STABLE]


def _counts(latencies: list[float], bounds: tuple[float, ...]) -> dict[float, int]:
    out = {b: sum(1 for x in latencies if x <= b) for b in bounds}
    out[math.inf] = len(latencies)
    return out


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


def _series(labels: str, before: dict[float, int], after: dict[float, int], at: int, end: int):
    """Cumulative bucket counters: `before` per minute until minute `at`, `after` from then."""
    for b in before:
        switch = at * before[b] + after[b]
        yield {
            "series": f'torchfleet_request_duration_seconds_bucket{{{labels},le="{_le(b)}"}}',
            "values": f"0+{before[b]}x{at} {switch}+{after[b]}x{end - at - 1}",
        }
    yield {
        "series": f'torchfleet_requests_total{{{labels},code="200"}}',
        "values": f"0+{PER_MINUTE}x{end}",
    }


def _p99(latencies: list[float], bounds: tuple[float, ...]) -> float:
    value = quantile(0.99, {float(k): float(v) for k, v in _counts(latencies, bounds).items()})
    assert value is not None
    return value


def test_the_latency_rules_see_a_fifth_slower_on_the_runtimes_buckets(tmp_path: Path) -> None:
    common = 'job="torchfleet-runtime",stack="s"'
    new_stable, new_slower = _counts(STABLE, LATENCY_BOUNDS), _counts(SLOWER, LATENCY_BOUNDS)
    new_spike = _counts(SPIKE, LATENCY_BOUNDS)
    old_stable, old_spike = _counts(STABLE, OLD_BOUNDS), _counts(SPIKE, OLD_BOUNDS)
    day, end = 1440, 1460
    versions = [
        *_series(f'{common},instance="a:8080",node="a"', new_stable, new_stable, 5, 20),
        *_series(f'{common},instance="b:8080",node="b"', new_slower, new_slower, 5, 20),
    ]
    versions += [
        {
            "series": f'torchfleet_model_info{{{common},instance="{i}:8080",model_version="{v}"}}',
            "values": "1x20",
        }
        for i, v in (("a", "v1"), ("b", "v2"))
    ]
    # what each node sustains at its batch cap: the capacity guard's figure, per version
    versions += [
        {
            "series": f'torchfleet_capacity_items_per_second{{{common},instance="{i}:8080"}}',
            "values": f"{c}x20",
        }
        for i, c in (("a", 1000), ("b", 250))
    ]
    days = [
        *_series(f'{common},instance="c:8080",node="new"', new_stable, new_spike, day, end),
        *_series(f'{common},instance="d:8080",node="old"', old_stable, old_spike, day, end),
    ]
    p99_v1, p99_v2 = _p99(STABLE, LATENCY_BOUNDS), _p99(SLOWER, LATENCY_BOUNDS)
    assert p99_v2 / p99_v1 > 1.15, (p99_v1, p99_v2)
    assert _p99(STABLE, OLD_BOUNDS) == _p99(SPIKE, OLD_BOUNDS)  # the blind spot
    rise = round(_p99(SPIKE, LATENCY_BOUNDS) / p99_v1, 2)
    assert rise > 1.3, rise
    doc = {
        "rule_files": [str(p) for p in RULE_FILES],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "per version p99 on the runtime's buckets",
                "interval": "15s",
                "input_series": versions,
                "promql_expr_test": [
                    {
                        "expr": "round(stack_version:torchfleet_request_duration_seconds:p99_rate1m * 1000, 0.1)",
                        "eval_time": "4m",
                        "exp_samples": [
                            {
                                "labels": '{stack="s",model_version="v1"}',
                                "value": round(p99_v1 * 1000, 1),
                            },
                            {
                                "labels": '{stack="s",model_version="v2"}',
                                "value": round(p99_v2 * 1000, 1),
                            },
                        ],
                    },
                    {
                        "expr": "stack_version:torchfleet_capacity_items_per_second:avg",
                        "eval_time": "4m",
                        "exp_samples": [
                            {
                                "labels": "stack_version:torchfleet_capacity_items_per_second:avg"
                                f'{{stack="s",model_version="{v}"}}',
                                "value": c,
                            }
                            for v, c in (("v1", 1000), ("v2", 250))
                        ],
                    },
                ],
            },
            {
                "name": "a node's p99 1.35x a day earlier, on the new buckets and the old",
                "interval": "1m",
                "input_series": days,
                "promql_expr_test": [
                    {
                        "expr": "round(node:torchfleet_request_duration_seconds:p99_rate5m"
                        " / (node:torchfleet_request_duration_seconds:p99_rate5m offset 1d), 0.01)",
                        "eval_time": f"{day + 10}m",
                        "exp_samples": [
                            {
                                "labels": '{stack="s",node="new"}',
                                "value": rise,
                            },
                            {"labels": '{stack="s",node="old"}', "value": 1},
                        ],
                    },
                    {
                        "expr": 'ALERTS{alertname="TorchfleetLatencySpike",alertstate="firing"}',
                        "eval_time": f"{day + 15}m",
                        "exp_samples": [
                            {
                                "labels": 'ALERTS{alertname="TorchfleetLatencySpike",'
                                'alertstate="firing",severity="ticket",stack="s",node="new"}',
                                "value": 1,
                            }
                        ],
                    },
                ],
            },
        ],
    }
    path = tmp_path / "latency_buckets.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    promtool_test(path)
