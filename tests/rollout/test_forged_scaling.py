"""One node's forged load figures against the scaling rules the example group stacks register.

Any node may write the figures (Alibaba: cms:PutCustomMetric takes no resource; AWS: any
dimension of the torchfleet namespace), so a rule must not move on one node's word. Each test
publishes what the nodes would (two honest nodes and one forger) into the metric store the rule
reads (tests/rollout/cms_sim.py for CloudMonitor, moto for CloudWatch), reads it back with the
rule's own statistic and compares with the rule's own threshold, as the alarm does. A control
case with honest nodes over the threshold shows the rule still fires, and the old statistic
(Average) shows what one forger could do before."""

from __future__ import annotations

import json
import operator

import boto3
import pytest
import yaml
from cms_sim import CmsSim
from moto import mock_aws

from infra.matrix import REPO_ROOT
from infra.offline import run_offline

# the cloud SDKs warn about their own deprecated modules when the program imports them
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

GROUP = "asg-under-test"
CMS_GROUP = "1001"
MINUTE_MS = 60_000


def _registered(stack: str, monkeypatch: pytest.MonkeyPatch):
    """The example stack's run under the mock engine (reference prices, no price API)."""
    monkeypatch.setenv("TORCHFLEET_PRICES", "offline")
    values = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]
    return run_offline(stack, values)


COMPARE = {">=": operator.ge, ">": operator.gt, "<": operator.lt, "<=": operator.le}


def _publish(cms: CmsSim, metric: str, values: list[float]) -> None:
    """Each node's figure four times in one minute, as the node agent publishes (every 15 s)."""
    for node, value in enumerate(values):
        for tick in range(4):
            cms.answer(
                "PutCustomMetric",
                {
                    "MetricList.1.GroupId": CMS_GROUP,
                    "MetricList.1.MetricName": metric,
                    "MetricList.1.Dimensions": json.dumps({"scaling_group": GROUP}),
                    "MetricList.1.Time": str(MINUTE_MS + 1 + tick * 15_000 + node),
                    "MetricList.1.Type": "0",
                    "MetricList.1.Values": json.dumps({"value": value}),
                },
            )


def _read(cms: CmsSim, metric: str, statistic: str) -> float:
    answer = cms.answer(
        "DescribeMetricList",
        {
            "Namespace": cms.namespace,
            "MetricName": metric,
            "Period": "60",
            "StartTime": str(MINUTE_MS),
            "EndTime": str(2 * MINUTE_MS),
            "Dimensions": json.dumps(
                [{"groupId": CMS_GROUP, "dimension": f"scaling_group={GROUP}"}]
            ),
        },
    )
    (point,) = json.loads(answer["Datapoints"])
    return float(point[statistic])


@pytest.fixture
def ess_alarms(monkeypatch):
    run = _registered("alicloud-prod", monkeypatch)
    alarms = [a.inputs for a in run.of_type("alicloud:ess/alarm:Alarm")]
    assert len(alarms) == 4  # three scale-out alarms, one scale-in
    return alarms


def _conditions(alarm: dict) -> list[tuple[str, str, str, float]]:
    """(metric, statistic, operator, threshold) of each of the alarm's conditions (&&)."""
    if alarm.get("expressions"):
        return [
            (e["metricName"], e["statistics"], e["comparisonOperator"], float(e["threshold"]))
            for e in alarm["expressions"]
        ]
    return [
        (
            alarm["metricName"],
            alarm["statistics"],
            alarm["comparisonOperator"],
            float(alarm["threshold"]),
        )
    ]


def _fires(alarm: dict, nodes: dict[str, list[float]], statistic: str | None = None) -> bool:
    cms = CmsSim("1234")
    for metric, values in nodes.items():
        _publish(cms, metric, values)
    return all(
        COMPARE[op](_read(cms, metric, statistic or stat), threshold)
        for metric, stat, op, threshold in _conditions(alarm)
    )


def _between(alarms: list[dict]) -> dict[str, float]:
    """A load per metric above every scale-in threshold and below every scale-out one."""
    out, low = {}, {}
    for alarm in alarms:
        for metric, _, op, threshold in _conditions(alarm):
            (out if op.startswith(">") else low)[metric] = threshold
    return {m: (out[m] + low[m]) / 2 for m in out}


def test_one_forged_figure_moves_no_ess_alarm(ess_alarms):
    calm = _between(ess_alarms)
    honest = {m: [v, v] for m, v in calm.items()}
    for alarm in ess_alarms:
        assert not _fires(alarm, honest), alarm["name"]
        for forged in (1e6, 0.0):  # as high as it likes, or nothing at all
            nodes = {m: [*vs, forged] for m, vs in honest.items()}
            assert not _fires(alarm, nodes), (alarm["name"], forged)


def test_the_ess_alarms_still_fire_on_the_honest_nodes_word(ess_alarms):
    calm = _between(ess_alarms)
    for alarm in ess_alarms:
        conditions = _conditions(alarm)
        factor = 3.0 if conditions[0][2].startswith(">") else 0.0  # busy, or idle
        nodes = {m: [v * factor] * 3 for m, v in calm.items()}
        assert _fires(alarm, nodes), alarm["name"]
        if factor:  # before: the mean of three nodes, one of them the forger's
            forged = {m: [v, v, 1e6] for m, v in calm.items()}
            assert _fires(alarm, forged, statistic="Average"), alarm["name"]


@mock_aws
def test_one_forged_figure_does_not_scale_an_auto_scaling_group_out(monkeypatch):
    """aws-prod's node-published target-tracking policies (queue depth, GPU utilisation) read
    CloudWatch with their own statistic: one node writing a huge figure leaves the metric at the
    honest nodes' level, below the target; honest nodes above it still scale out."""
    run = _registered("aws-prod", monkeypatch)
    policies = [
        p.inputs["targetTrackingConfiguration"]
        for p in run.of_type("aws:autoscaling/policy:Policy")
        if "customizedMetricSpecification" in p.inputs.get("targetTrackingConfiguration", {})
    ]
    assert len(policies) == 2
    cw = boto3.client("cloudwatch", region_name="us-east-1")
    for i, tt in enumerate(policies):
        spec, target = tt["customizedMetricSpecification"], float(tt["targetValue"])
        calm = target / 2
        forged = [calm, calm, 1e6]
        assert _cloudwatch(cw, spec, f"{i}-forged", forged) < target, spec  # no scale-out
        assert _cloudwatch(cw, spec, f"{i}-before", forged, "Average") > target  # one's word
        assert _cloudwatch(cw, spec, f"{i}-busy", [target * 2] * 3) > target  # honest load


def _cloudwatch(cw, spec: dict, case: str, values: list[float], statistic: str = "") -> float:
    """One datum per node in the same minute; the metric read back as the policy reads it."""
    statistic = statistic or spec["statistic"]
    dims = [{"Name": "AutoScalingGroupName", "Value": f"{GROUP}-{case}"}]
    for value in values:
        cw.put_metric_data(
            Namespace=spec["namespace"],
            MetricData=[
                {
                    "MetricName": spec["metricName"],
                    "Dimensions": dims,
                    "Value": value,
                    "Unit": spec["unit"],
                }
            ],
        )
    stats = cw.get_metric_statistics(
        Namespace=spec["namespace"],
        MetricName=spec["metricName"],
        Dimensions=dims,
        StartTime="2000-01-01T00:00:00Z",
        EndTime="2100-01-01T00:00:00Z",
        Period=60 * 60 * 24 * 365 * 200,
        Statistics=[statistic],
    )
    (point,) = stats["Datapoints"]
    return float(point[statistic])
