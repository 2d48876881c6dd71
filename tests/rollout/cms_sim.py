"""CloudMonitor's custom metrics as the node agent writes them and a rollout reads them, behind
tests/bootstrap/fake_alibaba.py (which checks the signatures):

- PutCustomMetric (2019-01-01): raw values (Type 0) kept with their application group, metric
  name, dimensions and time;
- DescribeMetricList on the namespace acs_customMetric_<account>: the raw values of one metric,
  application group and dimension ("k=v&..." with the keys in order) in (StartTime, EndTime]
  (milliseconds), aggregated per Period into Sum, Maximum, Minimum, Average and SampleCount,
  as a JSON string of data points, like the cloud answers (Alibaba's samples for custom
  monitoring: the dimension {"groupId", "dimension"});
- DescribeMetricList on acs_slb_dashboard (the dimension {"instanceId"}): the CLB's own figures,
  which no node can write: a test records them with `balancer(...)`."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

ACTIONS = ("PutCustomMetric", "DescribeMetricList")
SLB_NAMESPACE = "acs_slb_dashboard"


class CmsSim:
    def __init__(self, account: str) -> None:
        self.namespace = f"acs_customMetric_{account}"
        # (group id, metric, dimension) -> [(time ms, value)]
        self.points: dict[tuple[str, str, str], list[tuple[int, float]]] = defaultdict(list)
        # (instance id, metric) -> [(time ms, per-second value)]: the CLB's own
        self.slb: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)

    def balancer(self, instance: str, metric: str, time_ms: int, per_s: float) -> None:
        """What the load balancer itself measured (InstanceQps, InstanceUpstreamCode5xx)."""
        self.slb[(instance, metric)].append((time_ms, per_s))

    def answer(self, action: str, params: dict[str, str]) -> dict[str, Any]:
        if action == "PutCustomMetric":
            n = 1
            while f"MetricList.{n}.MetricName" in params:
                item = {
                    k.split(".", 2)[2]: v
                    for k, v in params.items()
                    if k.startswith(f"MetricList.{n}.")
                }
                if item.get("Type") != "0":
                    return {"Code": "InvalidParameter", "Message": "only raw values here"}
                dims = json.loads(item["Dimensions"])
                dimension = "&".join(f"{k}={v}" for k, v in sorted(dims.items()))
                key = (item["GroupId"], item["MetricName"], dimension)
                self.points[key].append(
                    (int(item["Time"]), float(json.loads(item["Values"])["value"]))
                )
                n += 1
            return {"Code": "200", "Message": "success"}
        if action == "DescribeMetricList" and params.get("Namespace") == SLB_NAMESPACE:
            (dim,) = json.loads(params["Dimensions"])
            series = self.slb.get((dim["instanceId"], params["MetricName"]), [])
            return self._aggregate(params, series, {"instanceId": dim["instanceId"]})
        if action == "DescribeMetricList":
            if params.get("Namespace") != self.namespace:
                return {
                    "Code": "400",
                    "Message": f"no namespace {params.get('Namespace')}",
                    "Success": False,
                }
            (dim,) = json.loads(params["Dimensions"])
            series = self.points.get((dim["groupId"], params["MetricName"], dim["dimension"]), [])
            return self._aggregate(
                params, series, {"groupId": dim["groupId"], "dimension": dim["dimension"]}
            )
        return {"Code": "UnsupportedOperation", "Message": action}

    @staticmethod
    def _aggregate(
        params: dict[str, str], series: list[tuple[int, float]], labels: dict[str, str]
    ) -> dict[str, Any]:
        period = int(params["Period"]) * 1000
        start, end = int(params["StartTime"]), int(params["EndTime"])
        buckets: dict[int, list[float]] = defaultdict(list)
        for t, v in series:
            if start < t <= end:
                buckets[t - t % period].append(v)
        points = [
            {
                "timestamp": at,
                **labels,
                "Sum": sum(vs),
                "Maximum": max(vs),
                "Minimum": min(vs),
                "Average": sum(vs) / len(vs),
                "SampleCount": len(vs),
            }
            for at, vs in sorted(buckets.items())
        ]
        return {
            "Code": "200",
            "Success": True,
            "Period": params["Period"],
            "Datapoints": json.dumps(points),
        }
