"""A rollout's weight step on a mode: group stack as a targeted update (`torchfleet rollout`;
which clouds: the rollout table, infra/rollout/clouds.py).

Without it every weight step ran the whole `up` pipeline (preflight, `pulumi up` of the stack,
inventory, readiness, smoke). A step changes one config key (`rollout.candidate_weight`), and
with it only the split's resources; the preflight already ran in the rollout's first `up` (the
one that placed the candidate's file), and a `pulumi up` of the whole stack would also apply
whatever else an operator changed in the config since, in the middle of a rollout.

Contract. `TargetedStep(stack, handle, cfg, console)` is called with the stack's config as it
was before the step (the step's change already written with `set_config` on `handle`, the
Automation API's Stack):
1. targets: the URNs of the resources the change creates, updates or deletes, found by running
   the Pulumi program under the mock engine (infra.offline) with the config before and after
   and comparing each resource's inputs. So the program itself says what a split touches (AWS:
   the listener's weighted forward, and where the candidate group is created, resized or
   removed, that group with its launch template, hooks and grants; Alibaba: the candidate ESS
   group, its scaling configuration and its VServer group attachment): no second list of
   resources to keep in step with it. The last run is kept, since a step's "before" is usually
   the step before's "after".
2. provision: `pulumi up` of those targets with target_dependents: a change that flows through
   an output (a launch template's new version into its group) is not in the mock engine's
   inputs and reaches the dependents that way; a dependent whose inputs are unchanged is left
   as it is. No targets: no `pulumi up`.
3. readiness (the group's healthy count reaches desired, candidate nodes included:
   readiness.wait_group) and 4. smoke (one prediction through the endpoint: smoke.predict), the
   pipeline's own stages, which guard a step as they guarded a whole `up`. A failure is the
   stage's StageError, as from `up`.
Chosen over setting the listener's weights through the cloud's API (elbv2 ModifyListener): a
step that creates or removes the candidate group needs the program anyway, and one writer of
the cloud keeps the stack's state equal to what the next `pulumi up` computes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pulumi
from pulumi import automation as auto

from infra.config import StackConfig
from infra.deploy import automation, readiness, smoke
from infra.deploy.capacity import MARKET_ENV
from infra.deploy.pipeline import GROUP_READY_TIMEOUT_S, Steps, auth_of
from infra.deploy.progress import Console, urn_name
from infra.offline import OfflineRun, run_offline


def _comparable(value: Any) -> Any:
    """An input as it compares across runs: an asset by what it names, not by identity."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    if isinstance(value, pulumi.FileAsset | pulumi.FileArchive):
        return (type(value).__name__, str(value.path))
    if isinstance(value, pulumi.StringAsset):
        return ("StringAsset", value.text)
    return value


def changed(before: OfflineRun, after: OfflineRun) -> list[str]:
    """The URNs whose resource `after` creates, deletes or registers with other inputs."""
    was = {r.urn: _comparable(r.inputs) for r in before.resources}
    now = {r.urn: _comparable(r.inputs) for r in after.resources}
    return sorted(urn for urn in was.keys() | now.keys() if was.get(urn) != now.get(urn))


def config_values(config: Mapping[str, auto.ConfigValue]) -> dict[str, str]:
    return {key: value.value for key, value in config.items()}


class TargetedStep:
    def __init__(
        self,
        stack: str,
        handle: Any,
        cfg: StackConfig,
        console: Console,
        ready_timeout_s: float = GROUP_READY_TIMEOUT_S,
        program: Callable[[str, dict[str, Any]], OfflineRun] = run_offline,
    ) -> None:
        self.stack, self.handle, self.cfg, self.console = stack, handle, cfg, console
        self.ready_timeout_s, self.program = ready_timeout_s, program
        self._runs: dict[str, OfflineRun] = {}  # config (JSON) -> its run; the last two kept

    def plan(self, values: dict[str, str]) -> OfflineRun:
        key = json.dumps(values, sort_keys=True)
        if key not in self._runs:
            self._runs = dict(list(self._runs.items())[-1:])
            self._runs[key] = self.program(self.stack, values)
        return self._runs[key]

    def targets(self, before: Mapping[str, auto.ConfigValue]) -> list[str]:
        now = config_values(self.handle.get_all_config())
        return changed(self.plan(config_values(before)), self.plan(now))

    def __call__(self, before: Mapping[str, auto.ConfigValue]) -> smoke.Prediction | None:
        steps = Steps(self.console, 3)
        with steps("provision", f"targeted pulumi up of stack {self.stack}: the split alone"):
            targets = self.targets(before)
            if not targets:
                self.console.line("  the step changes no resource: nothing to apply")
                return None
            self.console.line(
                f"  {len(targets)} target(s): " + ", ".join(urn_name(t) for t in targets)
            )
            automation.up(
                self.stack,
                self.console,
                opener=lambda _: self.handle,
                env={MARKET_ENV: ""},  # a group: its cloud falls back (infra.deploy.capacity)
                target=targets,
            )
        outputs = automation.outputs(self.stack, opener=lambda _: self.handle).values
        with steps("readiness", "the group's healthy count reaches desired, candidate included"):
            readiness.wait_group(
                self.stack, self.cfg.cloud, outputs, self.console, self.ready_timeout_s
            )
        endpoint = str(outputs["endpoint"])
        with steps("smoke", f"one prediction through the endpoint {endpoint}"):
            prediction = smoke.predict(endpoint, endpoint, "direct", auth_of(outputs))
            self.console.line(f"  {prediction.describe()}")
        return prediction
