"""CloudMonitor's custom metrics as the node agent writes them and a rollout reads them, behind
tests/bootstrap/fake_alibaba.py (which checks the signatures):

- PutCustomMetric (2019-01-01): raw values (Type 0) kept with their application group, metric
  name, dimensions and time;
- DescribeMetricList on the namespace acs_customMetric_<account>: the raw values of one metric,
  application group and dimension ("k=v&..." with the keys in order) in (StartTime, EndTime]
  (milliseconds), aggregated per Period into Sum, Maximum, Minimum, Average and SampleCount,
  as a JSON string of data points, like the cloud answers (Alibaba's samples for custom
  monitoring: the dimension {"groupId", "dimension"})."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

ACTIONS = ("PutCustomMetric", "DescribeMetricList")


class CmsSim:
    def __init__(self, account: str) -> None:
        self.namespace = f"acs_customMetric_{account}"
        # (group id, metric, dimension) -> [(time ms, value)]
        self.points: dict[tuple[str, str, str], list[tuple[int, float]]] = defaultdict(list)

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
        if action == "DescribeMetricList":
            if params.get("Namespace") != self.namespace:
                return {
                    "Code": "400",
                    "Message": f"no namespace {params.get('Namespace')}",
                    "Success": False,
                }
            (dim,) = json.loads(params["Dimensions"])
            period = int(params["Period"]) * 1000
            start, end = int(params["StartTime"]), int(params["EndTime"])
            buckets: dict[int, list[float]] = defaultdict(list)
            for t, v in self.points.get(
                (dim["groupId"], params["MetricName"], dim["dimension"]), []
            ):
                if start < t <= end:
                    buckets[t - t % period].append(v)
            points = [
                {
                    "timestamp": at,
                    "groupId": dim["groupId"],
                    "dimension": dim["dimension"],
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
        return {"Code": "UnsupportedOperation", "Message": action}
