"""A scaling group as ESS keeps it, answering the calls infra/rollout/refresh.py's EssRoll makes
through the official SDK (behind tests/bootstrap/fake_alibaba.py, which checks their signatures).

A node ESS starts is Pending (its launch hook: the node converges, then completes it) for
`ready_after` DescribeScalingInstances calls, then InService; None: it never gets there. A node
removed is Removing:Wait (its scale-in hook: leave, drain) for one call, then gone. ESS refuses
a desired size above MaxSize, as the cloud does. `in_service` keeps the number of nodes in
service each DescribeScalingInstances saw, so a test can assert the floor."""

from __future__ import annotations

import itertools
from typing import Any

GROUP_ID = "asg-sim"


class EssSim:
    def __init__(
        self,
        name: str,
        nodes: int,
        configuration: str = "scfg-old",
        max_size: int | None = None,
        ready_after: int | None = 2,
    ) -> None:
        self.name, self.active = name, configuration
        self.max_size = nodes if max_size is None else max_size
        self.desired = nodes
        self.ready_after = ready_after
        self._ids = (f"i-{n:04d}" for n in itertools.count())
        # id -> [configuration, state, calls seen]
        self.nodes: dict[str, list[Any]] = {
            next(self._ids): [configuration, "InService", 0] for _ in range(nodes)
        }
        self.in_service: list[int] = []
        self.removed: list[list[str]] = []
        self.max_sizes: list[int] = []

    def serving(self) -> dict[str, str]:
        return {i: n[0] for i, n in self.nodes.items() if n[1] == "InService"}

    def answer(self, action: str, params: dict[str, str]) -> dict[str, Any]:
        if params.get("RegionId") is None and action != "ModifyScalingGroup":  # keyed by group
            return {"Code": "MissingRegionId", "Message": "RegionId is mandatory"}
        if action == "DescribeScalingGroups":
            if params.get("ScalingGroupName") != self.name:
                return {"ScalingGroups": [], "TotalCount": 0}
            return {
                "ScalingGroups": [
                    {
                        "ScalingGroupId": GROUP_ID,
                        "ScalingGroupName": self.name,
                        "ActiveScalingConfigurationId": self.active,
                        "DesiredCapacity": self.desired,
                        "MaxSize": self.max_size,
                        "MinSize": 1,
                    }
                ],
                "TotalCount": 1,
            }
        if params.get("ScalingGroupId") != GROUP_ID:
            return {"Code": "InvalidScalingGroupId.NotFound", "Message": "no such group"}
        if action == "DescribeScalingInstances":
            return self._describe(int(params.get("PageNumber", 1)), int(params["PageSize"]))
        if action == "ModifyScalingGroup":
            return self._modify(params)
        if action == "RemoveInstances":
            ids = [v for k, v in sorted(params.items()) if k.startswith("InstanceIds.")]
            if params.get("DecreaseDesiredCapacity", "").lower() != "true" or not ids:
                return {"Code": "Unexpected", "Message": f"RemoveInstances {params}"}
            for i in ids:
                if self.nodes.get(i, [None, None])[1] != "InService":
                    return {"Code": "IncorrectInstanceStatus", "Message": i}
                self.nodes[i][1:] = ["Removing:Wait", 0]
            self.desired -= len(ids)
            self.removed.append(ids)
            return {"ScalingActivityId": "asa-remove"}
        return {"Code": "UnsupportedOperation", "Message": action}

    def _modify(self, params: dict[str, str]) -> dict[str, Any]:
        max_size = int(params.get("MaxSize", self.max_size))
        desired = int(params.get("DesiredCapacity", self.desired))
        if desired > max_size:
            return {"Code": "InvalidParameter", "Message": "DesiredCapacity > MaxSize"}
        if "MaxSize" in params:
            self.max_size = max_size
            self.max_sizes.append(max_size)
        alive = sum(n[1] != "Removing:Wait" for n in self.nodes.values())
        for _ in range(desired - alive):
            self.nodes[next(self._ids)] = [self.active, "Pending", 0]
        self.desired = desired
        return {}

    def _describe(self, page: int, size: int) -> dict[str, Any]:
        if page == 1:  # one poll: time passes for every node
            self.in_service.append(len(self.serving()))
            for i, n in list(self.nodes.items()):
                n[2] += 1
                if n[1] == "Removing:Wait":
                    del self.nodes[i]
                elif n[1] == "Pending" and n[2] > (self.ready_after or float("inf")):
                    n[1] = "InService"
        listed = [
            {
                "InstanceId": i,
                "ScalingConfigurationId": n[0],
                "LifecycleState": n[1],
                "HealthStatus": "Healthy",
                "CreationType": "AutoCreated",
            }
            for i, n in self.nodes.items()
        ]
        return {
            "ScalingInstances": listed[(page - 1) * size : page * size],
            "TotalCount": len(listed),
            "PageNumber": page,
            "PageSize": size,
        }
