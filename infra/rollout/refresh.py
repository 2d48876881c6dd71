"""A group stack's promotion reaching its running nodes: after `up` moved the stable track's
model (the rollout block's stable_model in the group's user-data), every running stable node is
replaced by one on the new configuration before the rollout goes on (the candidate group leaves
only once the stable group serves the candidate's model on every node).

Contract. `roll(since)` returns once the stable group(s) run only the new configuration, saying
its progress one line per change; RefreshError says what failed and what is left. `since` is the
wall-clock time `up` started (AWS: refreshes older than it are not this promotion's).

- AWS (`AsgRefresh`): `up` changed the stable groups' launch template, on which the provider
  starts an instance refresh (infra/aws/fleet.py: rolling, min healthy 50 %, warm-up, skip
  matching, auto-rollback). This waits for the refresh of each group (the spot group and its
  on-demand fallback) to end: Successful goes on; Failed, Cancelled or a rollback raises with
  AWS's reason. A group with no refresh since `since` had nothing to replace.
- Alibaba (`EssRoll`): ESS's StartInstanceRefresh serves only groups whose scale-out policy is
  "priority", and the stable group's is COST_OPTIMIZED (its on-demand base under spot:
  infra/alicloud/fleet.py), so the roll is ours, surge first like PAI-EAS's rolling update with
  max_unavailable 0: `up` replaced the group's scaling configuration (a new one, active at once);
  while nodes in service run an older one, a batch of them (SURGE_PERCENT of the desired size,
  at least one) is replaced: the desired size goes up by the batch (ModifyScalingGroup, MaxSize
  raised for the roll when it must be and put back after), ESS starts that many nodes on the
  active configuration, which enter service only once ready (their launch hook completes after
  /readyz and joining the VServer group: the node agent); then the batch is removed with the
  desired size (RemoveInstances, DecreaseDesiredCapacity), each node leaving the VServer group
  and draining first (the scale-in hook). The nodes in service never drop below their number
  before the roll. A batch not in service (or not gone) within BATCH_TIMEOUT_S raises; the old
  nodes of that batch still serve then.

Both take their SDK client (boto3 autoscaling; alibabacloud_ess20220222, reached through the
operator's keys: infra.credentials.alicloud_keys, ALICLOUD_ESS_ENDPOINT overriding the endpoint),
a clock and a sleep, so the tests drive them against a stand-in without waiting.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from infra.rollout.errors import RolloutError

# ESS's own default MaxHealthyPercentage for a refresh is 120: one node in five at a time.
SURGE_PERCENT = 20
# A GPU node from the stub user-data: boot, converge (driver, CUDA, torch), load and warm.
BATCH_TIMEOUT_S = 45 * 60.0
POLL_S = 15.0
# AWS: the refresh's own warm-up and checkpoints bound it; this only stops an endless wait.
REFRESH_TIMEOUT_S = 3 * 3600.0
AWS_DONE = {"Successful"}
AWS_FAILED = {"Failed", "Cancelled", "RollbackSuccessful", "RollbackFailed"}
IN_SERVICE = "InService"


class RefreshError(RolloutError):
    """The running nodes did not all reach the new configuration (the message says what is
    left)."""


class Refresh(Protocol):
    def roll(self, since: float) -> None: ...


class AsgRefresh:
    def __init__(
        self,
        groups: list[str],
        region: str,
        say: Callable[[str], None] = print,
        asg: Any = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        timeout_s: float = REFRESH_TIMEOUT_S,
        poll_s: float = POLL_S,
    ) -> None:
        if asg is None:
            import boto3

            asg = boto3.client("autoscaling", region_name=region)
        self.groups, self.asg, self.say = groups, asg, say
        self.clock, self.sleep, self.timeout_s, self.poll_s = clock, sleep, timeout_s, poll_s

    def roll(self, since: float) -> None:
        for group in self.groups:
            self._wait(group, since)

    def _latest(self, group: str) -> dict[str, Any] | None:
        found = self.asg.describe_instance_refreshes(AutoScalingGroupName=group, MaxRecords=1)
        refreshes: list[dict[str, Any]] = found.get("InstanceRefreshes") or []
        return refreshes[0] if refreshes else None

    def _wait(self, group: str, since: float) -> None:
        deadline = self.clock() + self.timeout_s
        said = None
        while True:
            r = self._latest(group)
            if r is None or r["StartTime"].timestamp() < since:
                self.say(f"  {group}: no instance refresh since the change: no node to replace")
                return
            status = r["Status"]
            line = (
                f"  {group}: instance refresh {r['InstanceRefreshId']} {status}, "
                f"{r.get('PercentageComplete', 0)} % done, "
                f"{r.get('InstancesToUpdate', '?')} node(s) to replace"
            )
            if line != said:
                self.say(line)
                said = line
            if status in AWS_DONE:
                return
            if status in AWS_FAILED:
                raise RefreshError(
                    f"the instance refresh {r['InstanceRefreshId']} of {group} ended "
                    f"{status}: {r.get('StatusReason') or 'no reason given'}"
                )
            if self.clock() >= deadline:
                raise RefreshError(
                    f"the instance refresh {r['InstanceRefreshId']} of {group} is still "
                    f"{status} after {self.timeout_s:g} s ({r.get('PercentageComplete', 0)} % "
                    "done); it goes on in AWS: `aws autoscaling describe-instance-refreshes`"
                )
            self.sleep(self.poll_s)


def ess_client(region: str) -> Any:
    """An ESS client with the operator's Alibaba keys (ALICLOUD_ESS_ENDPOINT overrides)."""
    from alibabacloud_ess20220222.client import Client

    from infra.credentials import CredentialsError, operator_config

    try:
        return Client(operator_config(region, "ESS", "ALICLOUD_ESS_ENDPOINT"))
    except CredentialsError as err:
        raise RefreshError(f"{err.message}: {err.fix}") from None


@dataclass(frozen=True)
class _Group:
    id: str
    active: str  # the active scaling configuration's id
    desired: int
    max_size: int


@dataclass(frozen=True)
class _Node:
    id: str
    configuration: str
    state: str


class EssRoll:
    def __init__(
        self,
        group: str,
        region: str,
        say: Callable[[str], None] = print,
        ess: Any = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        batch_timeout_s: float = BATCH_TIMEOUT_S,
        poll_s: float = POLL_S,
    ) -> None:
        self.name, self.region, self.say = group, region, say
        self._ess = ess
        self.clock, self.sleep = clock, sleep
        self.batch_timeout_s, self.poll_s = batch_timeout_s, poll_s

    @property
    def ess(self) -> Any:
        if self._ess is None:
            self._ess = ess_client(self.region)
        return self._ess

    def _call(self, action: str, request: dict[str, Any]) -> dict[str, Any]:
        from alibabacloud_ess20220222 import models
        from darabonba.runtime import RuntimeOptions

        method = "".join("_" + c.lower() if c.isupper() else c for c in action).lstrip("_")
        model = getattr(models, f"{action}Request")().from_map({"RegionId": self.region, **request})
        runtime = RuntimeOptions(
            autoretry=True, max_attempts=3, connect_timeout=3000, read_timeout=10000
        )
        ess = self.ess  # the keys first: their error is not the call's
        try:
            body: dict[str, Any] = getattr(ess, f"{method}_with_options")(
                model, runtime
            ).body.to_map()
        except Exception as err:  # the SDK raises its own error types and the network's
            raise RefreshError(f"ESS {action} on {self.name}: {err}") from None
        return body

    def _group(self) -> _Group:
        found = self._call("DescribeScalingGroups", {"ScalingGroupName": self.name})
        groups = found.get("ScalingGroups") or []
        if not groups:
            raise RefreshError(f"no scaling group {self.name} in {self.region}")
        g = groups[0]
        return _Group(
            g["ScalingGroupId"],
            g.get("ActiveScalingConfigurationId", ""),
            int(g.get("DesiredCapacity") or 0),
            int(g["MaxSize"]),
        )

    def _nodes(self, group_id: str) -> list[_Node]:
        nodes: list[_Node] = []
        page = 1
        while True:
            found = self._call(
                "DescribeScalingInstances",
                {"ScalingGroupId": group_id, "PageSize": 50, "PageNumber": page},
            )
            batch = found.get("ScalingInstances") or []
            nodes += [
                _Node(i["InstanceId"], i.get("ScalingConfigurationId", ""), i["LifecycleState"])
                for i in batch
            ]
            if not batch or len(nodes) >= int(found.get("TotalCount") or 0):
                return nodes
            page += 1

    def roll(self, since: float = 0.0) -> None:
        group = self._group()
        plan_max = group.max_size
        raised_max = False
        try:
            while True:
                nodes = self._nodes(group.id)
                serving = [n for n in nodes if n.state == IN_SERVICE]
                old = [n for n in serving if n.configuration != group.active]
                if not old:
                    self.say(
                        f"  {self.name}: {len(serving)} node(s) in service, all on the active "
                        f"configuration {group.active}"
                    )
                    return
                batch = old[: max(1, math.ceil(group.desired * SURGE_PERCENT / 100))]
                raised_max = self._surge(group, len(batch), len(old)) or raised_max
                goal = len(serving) - len(old) + len(batch)
                self._wait(
                    group.id,
                    partial(_reached, configuration=group.active, goal=goal),
                    f"{len(batch)} new node(s) in service on {group.active}",
                )
                ids = [n.id for n in batch]
                self._call(
                    "RemoveInstances",
                    {
                        "ScalingGroupId": group.id,
                        "InstanceIds": ids,
                        "DecreaseDesiredCapacity": True,
                        "RemovePolicy": "release",
                    },
                )
                self.say(f"  {self.name}: {', '.join(ids)} leave (drained first) and are released")
                self._wait(
                    group.id,
                    partial(_gone, ids=set(ids)),
                    f"{', '.join(ids)} removed",
                )
                group = self._group()  # its desired size and MaxSize after the batch
        finally:
            if raised_max:
                # the roll's surge is over (or failed): the plan's MaxSize again, unless the
                # group still wants more nodes than it (then the next `up` puts it back)
                now = self._group()
                if now.desired <= plan_max:
                    self._call(
                        "ModifyScalingGroup", {"ScalingGroupId": now.id, "MaxSize": plan_max}
                    )

    def _surge(self, group: _Group, batch: int, old: int) -> bool:
        """Ask ESS for `batch` more nodes (on the active configuration); whether MaxSize rose."""
        desired = group.desired + batch
        change: dict[str, Any] = {"ScalingGroupId": group.id, "DesiredCapacity": desired}
        if desired > group.max_size:
            change["MaxSize"] = desired
        self.say(
            f"  {self.name}: {old} node(s) in service on an older configuration; {batch} more on "
            f"{group.active} first (desired {group.desired} -> {desired})"
        )
        self._call("ModifyScalingGroup", change)
        return "MaxSize" in change

    def _wait(self, group_id: str, done: Callable[[list[_Node]], bool], what: str) -> None:
        deadline = self.clock() + self.batch_timeout_s
        while True:
            nodes = self._nodes(group_id)
            if done(nodes):
                return
            if self.clock() >= deadline:
                states = ", ".join(f"{n.id} {n.state} ({n.configuration})" for n in nodes)
                raise RefreshError(
                    f"{self.name}: not {what} after {self.batch_timeout_s:g} s; the group holds "
                    f"{states or 'no node'}"
                )
            self.sleep(self.poll_s)


def _reached(nodes: list[_Node], configuration: str, goal: int) -> bool:
    """At least `goal` of `nodes` in service on `configuration`."""
    return sum(n.state == IN_SERVICE and n.configuration == configuration for n in nodes) >= goal


def _gone(nodes: list[_Node], ids: set[str]) -> bool:
    return not any(n.id in ids for n in nodes)
