"""CloudWatchSource: an AWS group stack's per-track figures from its ALB's metrics
(AWS/ApplicationELB, LoadBalancer + TargetGroup), one GetMetricData call per window.

The counts (RequestCount, HTTPCode_Target_5XX_Count: Sum) go through moto's CloudWatch, which
computes Sum from the data put. moto's get_metric_data cannot compute a percentile: a "p99" stat
fails inside moto (TypeError on its None statistic), so the moto tests hand the p99 queries an
empty answer through a thin proxy, and the p99 path is tested with botocore's Stubber on the
exact request and response shape. No AWS account ran any of this."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from infra.rollout import signals
from infra.rollout.policy import Figures, GuardSettings, RolloutSettingsError, judge
from infra.rollout.signals import CloudWatchSource, SignalError, cloudwatch_period

REGION = "us-east-1"
LB = "app/torchfleet-aws-prod-alb/0123456789abcdef"
TG = {
    "stable": "targetgroup/torchfleet-aws-prod-tg/1111111111111111",
    "candidate": "targetgroup/torchfleet-aws-prod-tg-candidate/2222222222222222",
}
DIMS = {"namespace": "AWS/ApplicationELB", "load_balancer": LB, "target_groups": TG}
STABLE, CAND = "sha256:5555aaaa5555", "sha256:ccccdddd0000"
T0 = datetime(2026, 12, 3, 3, 0, tzinfo=UTC)  # a whole minute
# a 60 s window ending 2 min 5 s after T0 reads [T0, T0 + 60 s): one minute, 60 s behind
NOW = (T0 + timedelta(seconds=125)).timestamp()


def _source(cw: Any, window_s: float = 60, now: float = NOW) -> CloudWatchSource:
    return CloudWatchSource(
        dimensions=lambda: DIMS,
        versions=lambda: {"stable": STABLE, "candidate": CAND},
        window_s=window_s,
        region=REGION,
        client=cw,
        clock=lambda: now,
    )


def _put(cw: Any, track: str, metric: str, value: float, at: datetime) -> None:
    cw.put_metric_data(
        Namespace="AWS/ApplicationELB",
        MetricData=[
            {
                "MetricName": metric,
                "Dimensions": [
                    {"Name": "LoadBalancer", "Value": LB},
                    {"Name": "TargetGroup", "Value": TG[track]},
                ],
                "Timestamp": at,
                "Value": value,
                "Unit": "Count",
            }
        ],
    )


class NoPercentiles:
    """moto's client, less the percentile queries moto cannot answer (module doc)."""

    def __init__(self, cw: Any) -> None:
        self.cw, self.calls = cw, 0

    def get_metric_data(self, MetricDataQueries: list[dict], **kw: Any) -> dict:
        self.calls += 1
        counted = [q for q in MetricDataQueries if q["MetricStat"]["Stat"] != "p99"]
        doc = self.cw.get_metric_data(MetricDataQueries=counted, **kw)
        doc["MetricDataResults"] += [
            {"Id": q["Id"], "Values": [], "StatusCode": "Complete"}
            for q in MetricDataQueries
            if q not in counted
        ]
        return dict(doc)


@pytest.fixture
def cw():
    with mock_aws():
        yield boto3.client("cloudwatch", region_name=REGION)


def _traffic(cw: Any, cand_errors: float) -> None:
    """The minute [T0, T0+60 s) in two puts per metric (moto sums them), and a minute before it
    that the window must not count."""
    for at in (T0 + timedelta(seconds=10), T0 + timedelta(seconds=40)):
        _put(cw, "stable", "RequestCount", 450, at)
        _put(cw, "candidate", "RequestCount", 50, at)
        _put(cw, "candidate", "HTTPCode_Target_5XX_Count", cand_errors / 2, at)
    before = T0 - timedelta(seconds=30)
    _put(cw, "stable", "RequestCount", 10_000, before)
    _put(cw, "candidate", "HTTPCode_Target_5XX_Count", 10_000, before)


def test_the_figures_per_version_come_from_each_target_group_in_one_call(cw):
    _traffic(cw, cand_errors=0)
    client = NoPercentiles(cw)
    source = _source(client)
    source.begin()
    figures = source.end()
    assert client.calls == 1
    assert figures == {
        STABLE: Figures(STABLE, 900, 0, None),
        CAND: Figures(CAND, 100, 0, None),
    }


def test_a_candidate_s_5xx_ratio_fires_the_error_guard(cw):
    _traffic(cw, cand_errors=30)
    source = _source(NoPercentiles(cw))
    source.begin()
    figures = source.end()
    assert figures[CAND].errors == 30 and figures[STABLE].errors == 0
    verdict = judge(figures[STABLE], figures[CAND], GuardSettings())
    assert verdict.decision == "rollback" and verdict.guard == "error_ratio"
    assert "30.00 %" in verdict.reason


def test_two_tracks_on_one_version_add_up(cw):
    """No split (or the promotion): both target groups serve one version."""
    _traffic(cw, cand_errors=4)
    source = CloudWatchSource(
        dimensions=lambda: DIMS,
        versions=lambda: {"stable": CAND, "candidate": CAND},
        window_s=60,
        region=REGION,
        client=NoPercentiles(cw),
        clock=lambda: NOW,
    )
    source.begin()
    assert source.end() == {CAND: Figures(CAND, 1000, 4, None)}


@pytest.mark.parametrize("window", [1, 30, 59.9])
def test_a_window_under_a_minute_is_refused_naming_the_flag(window):
    with pytest.raises(RolloutSettingsError, match=r"--window = .* at least 60s"):
        _source(None, window_s=window)


def test_the_period_is_the_window_s_whole_minutes():
    assert [cloudwatch_period(w) for w in (60, 90, 120, 150, 300)] == [60, 60, 120, 120, 300]
    source = _source(None, window_s=150)
    start, end = source.span(NOW)
    assert (start, end) == (T0 - timedelta(seconds=60), T0 + timedelta(seconds=60))
    assert "120 s metric period" in source.describe()


def test_the_p99_path_on_the_exact_request_and_response_shape():
    """Stubber: the one GetMetricData request (six queries: three metrics of two target groups,
    the p99 as the stat "p99") and CloudWatch's answer; the p99 is seconds, per target group."""
    client = boto3.client(
        "cloudwatch",
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    queries = [
        {
            "Id": f"{track}_{key}",
            "MetricStat": {
                "Metric": {
                    "Namespace": "AWS/ApplicationELB",
                    "MetricName": metric,
                    "Dimensions": [
                        {"Name": "LoadBalancer", "Value": LB},
                        {"Name": "TargetGroup", "Value": TG[track]},
                    ],
                },
                "Period": 60,
                "Stat": stat,
            },
            "ReturnData": True,
        }
        for track in ("candidate", "stable")
        for key, metric, stat in (
            ("requests", "RequestCount", "Sum"),
            ("errors", "HTTPCode_Target_5XX_Count", "Sum"),
            ("p99", "TargetResponseTime", "p99"),
        )
    ]
    values = {
        "candidate_requests": [100.0],
        "candidate_errors": [],  # no 5xx: CloudWatch reports no data point
        "candidate_p99": [0.09],
        "stable_requests": [900.0],
        "stable_errors": [1.0],
        "stable_p99": [0.05],
    }
    response = {
        "MetricDataResults": [
            {
                "Id": q["Id"],
                "Label": q["Id"],
                "Timestamps": [T0] * len(values[q["Id"]]),
                "Values": values[q["Id"]],
                "StatusCode": "Complete",
            }
            for q in queries
        ],
        "Messages": [],
    }
    with Stubber(client) as stub:
        stub.add_response(
            "get_metric_data",
            response,
            {"MetricDataQueries": queries, "StartTime": T0, "EndTime": T0 + timedelta(seconds=60)},
        )
        source = _source(client)
        source.begin()
        figures = source.end()
        stub.assert_no_pending_responses()
    assert figures == {
        STABLE: Figures(STABLE, 900, 1, 0.05),
        CAND: Figures(CAND, 100, 0, 0.09),
    }
    verdict = judge(figures[STABLE], figures[CAND], GuardSettings())
    assert verdict.decision == "rollback" and verdict.guard == "p99"


def test_a_failed_call_or_a_partial_answer_is_a_signal_error():
    client = boto3.client(
        "cloudwatch",
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    with Stubber(client) as stub:
        stub.add_client_error("get_metric_data", "AccessDenied", "not allowed")
        stub.add_response(
            "get_metric_data",
            {"MetricDataResults": [{"Id": "stable_requests", "StatusCode": "InternalError"}]},
        )
        source = _source(client)
        source.begin()
        with pytest.raises(
            SignalError, match=r"CloudWatch GetMetricData \(us-east-1\).*AccessDenied"
        ):
            source.end()
        with pytest.raises(SignalError, match="stable_requests is InternalError"):
            source.end()


def test_an_output_without_the_candidate_target_group_is_a_signal_error():
    source = CloudWatchSource(
        dimensions=lambda: {"load_balancer": LB, "target_groups": {"stable": TG["stable"]}},
        versions=lambda: {"stable": STABLE},
        window_s=60,
        region=REGION,
        client=object(),
        clock=lambda: NOW,
    )
    with pytest.raises(SignalError, match="rollout_metrics names no candidate target group"):
        source.end()


class StubCms:
    """DescribeMetricList answers as the SDK hands them back (a body with a Datapoints string)."""

    def __init__(
        self, points: list[dict], code: str = "200", balancer: list[dict] | None = None
    ) -> None:
        self.points, self.code, self.asked = points, code, []
        self.balancer = balancer or []  # acs_slb_dashboard's answer: the CLB's own figures

    def describe_metric_list(self, request):
        from types import SimpleNamespace

        self.asked.append(request)
        clb = request.namespace == signals.CLB_NAMESPACE
        body = SimpleNamespace(
            code=self.code,
            success=self.code == "200",
            message="denied" if self.code != "200" else None,
            datapoints=json.dumps(self.balancer if clb else self.points),
            next_token=None,
        )
        return SimpleNamespace(body=body)


ALI_DIMS = {
    "namespace": "acs_customMetric_1208863178610000",
    "metric_group": "4242",
    "scaling_groups": {"stable": "asg-stable", "candidate": "asg-cand"},
    "load_balancer": "lb-uf6test",
}


def _cms_source(client, dims=ALI_DIMS) -> signals.CloudMonitorSource:
    source = signals.CloudMonitorSource(
        dimensions=lambda: dims,
        versions=lambda: {"stable": "v1", "candidate": "v2"},
        window_s=60,
        region="cn-shanghai",
        client=client,
        clock=lambda: NOW,
    )
    source.begin()
    return source


@pytest.mark.parametrize(
    ("client", "dims", "says"),
    [
        (StubCms([{"timestamp": 1, "Average": 3.0}]), ALI_DIMS, "data points have no Sum"),
        (StubCms([], code="403"), ALI_DIMS, "DescribeMetricList RequestCount: 403 denied"),
        (
            StubCms([]),
            {**ALI_DIMS, "scaling_groups": {"stable": "asg-stable"}},
            "names no candidate scaling group",
        ),
    ],
)
def test_cloudmonitor_figures_that_cannot_be_read_are_a_signal_error(client, dims, says):
    with pytest.raises(SignalError, match=says):
        _cms_source(client, dims).end()


def test_cloudmonitor_asks_each_tracks_scaling_group_in_the_application_group():
    # each track: 10 requests, 10 of them 5xx; the CLB: 20 requests, 20 backend 5xx in 60 s
    client = StubCms(
        [{"timestamp": 1, "Sum": 10.0, "Maximum": 0.2}],
        balancer=[{"timestamp": 1, "Average": 20 / 60}],
    )
    figures = _cms_source(client).end()
    assert figures["v1"].requests == 10.0 and figures["v2"].p99_s == 0.2
    nodes = [r for r in client.asked if r.namespace == ALI_DIMS["namespace"]]
    clb = [r for r in client.asked if r.namespace == "acs_slb_dashboard"]
    assert {r.metric_name for r in clb} == {"InstanceQps", "InstanceUpstreamCode5xx"}
    assert [json.loads(r.dimensions) for r in clb] == [[{"instanceId": "lb-uf6test"}]] * 2
    client.asked = nodes
    dims = {json.loads(r.dimensions)[0]["dimension"] for r in client.asked}
    assert dims == {"scaling_group=asg-stable", "scaling_group=asg-cand"}
    assert {json.loads(r.dimensions)[0]["groupId"] for r in client.asked} == {"4242"}
    assert {r.period for r in client.asked} == {"60"}


@pytest.mark.parametrize(
    ("nodes", "balancer", "says"),
    [
        ((1000, 30), (1000, 30), None),  # they agree
        ((990, 31), (1050, 28), None),  # minute edges, redirects the CLB answers itself
        ((1000, 30), (1000, 0), "the nodes report 30 5xx, the load balancer saw 0"),  # forged
        ((1000, 0), (1000, 30), "the nodes report 0 5xx, the load balancer saw 30"),  # hidden
        ((5000, 0), (1000, 0), "the nodes report 5000 requests, the load balancer forwarded"),
    ],
)
def test_the_nodes_totals_are_held_against_the_load_balancer(nodes, balancer, says):
    if says is None:
        signals.cross_check(*nodes, *balancer)
        return
    with pytest.raises(signals.SignalMismatch, match=says):
        signals.cross_check(*nodes, *balancer)


def test_a_stack_output_without_the_load_balancer_cannot_be_cross_checked():
    client = StubCms([{"timestamp": 1, "Sum": 1.0, "Maximum": 0.2}])
    dims = {k: v for k, v in ALI_DIMS.items() if k != "load_balancer"}
    with pytest.raises(SignalError, match="names no load_balancer") as err:
        _cms_source(client, dims).end()
    assert not isinstance(err.value, signals.SignalMismatch)  # unreadable, not a forgery
