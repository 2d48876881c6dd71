"""Instances mode's spot fallback in `up` (infra.deploy.capacity): the provision stage through the
Automation API layer (infra.deploy.automation) with a stack whose first `pulumi up` fails the way
the AWS provider reports a spot request it cannot place. What the program then builds with the
fallback set is tested under the mock engine (tests/infra/test_fallback.py)."""

from __future__ import annotations

import dataclasses

import pytest
from pulumi import automation as auto
from pulumi.automation import CommandResult

from infra.config import StackConfig, load, raw_from_pulumi_config
from infra.deploy import automation, capacity
from infra.deploy.stage import StageError
from infra.plan import load_stack_config

# The shape of the provider's error as `pulumi up` prints it (stderr of the CLI).
NO_SPOT = (
    "error: 1 error occurred:\n"
    "    * creating EC2 Instance: operation error EC2: RunInstances, https response error "
    "StatusCode: 500, RequestID: 5f0e, api error InsufficientInstanceCapacity: There is no Spot "
    "capacity available that matches your request.\n"
)


def stack_config(stack: str) -> StackConfig:
    return load(raw_from_pulumi_config(load_stack_config(stack)), stack)


class Workspace:
    def __init__(self) -> None:
        self.env_vars: dict[str, str] = {}


class CapacityStack:
    """A stack whose `up` fails with `error` while the program would buy spot (MARKET_ENV
    unset or empty in the workspace's environment), and succeeds on-demand."""

    def __init__(self, error: str = NO_SPOT, spot_ok: bool = False) -> None:
        self.workspace = Workspace()
        self.error, self.spot_ok = error, spot_ok
        self.markets: list[str] = []

    def up(self, on_event=None, on_output=None, **kwargs):
        reason = self.workspace.env_vars.get(capacity.MARKET_ENV, "")
        self.markets.append("on-demand" if reason else "spot")
        if not reason and not self.spot_ok:
            raise auto.CommandError(CommandResult(stdout="", stderr=self.error, code=255))
        return auto.UpResult(stdout="", stderr="", summary=None, outputs={})


def provision(cfg, stack, console):
    return capacity.provision(
        cfg,
        lambda env: automation.up(cfg.stack, console, opener=lambda _: stack, env=env),
        console.line,
    )


def test_a_spot_capacity_error_retries_the_nodes_on_demand_and_says_so(console, text):
    cfg = stack_config("aws-dev")
    assert cfg.spot.enabled and cfg.spot.fallback == "on_demand"
    stack = CapacityStack()
    provision(cfg, stack, console)
    assert stack.markets == ["spot", "on-demand"]
    reason = stack.workspace.env_vars[capacity.MARKET_ENV]
    assert reason.startswith("InsufficientInstanceCapacity for spot g6.xlarge in ")
    out = text(console)
    assert "spot could not be had (InsufficientInstanceCapacity" in out
    assert "nodes: on-demand (spot.fallback: on_demand after InsufficientInstanceCapacity)" in out


def test_spot_placed_says_spot_and_its_cap(console, text):
    cfg = stack_config("aws-dev")
    stack = CapacityStack(spot_ok=True)
    provision(cfg, stack, console)
    assert stack.markets == ["spot"]
    assert f"nodes: spot (cap {cfg.spot_cap(cfg.instance_type):.4f} USD/h)" in text(console)


def test_fallback_fail_stops_with_the_capacity_error_and_what_to_change(console):
    cfg = stack_config("aws-dev")
    cfg = dataclasses.replace(cfg, spot=dataclasses.replace(cfg.spot, fallback="fail"))
    stack = CapacityStack()
    with pytest.raises(StageError) as info:
        provision(cfg, stack, console)
    assert stack.markets == ["spot"]
    assert info.value.stage == "provision"
    assert "InsufficientInstanceCapacity" in info.value.fix
    assert "spot.fallback: on_demand" in info.value.fix


@pytest.mark.parametrize(
    "error",
    [
        "error: creating EC2 Instance: UnauthorizedOperation: not authorized\n",
        "error: creating EC2 Instance: InstanceLimitExceeded: vCPU limit\n",
    ],
)
def test_other_failures_are_not_retried(console, error):
    cfg = stack_config("aws-dev")
    stack = CapacityStack(error=error)
    with pytest.raises(StageError):
        provision(cfg, stack, console)
    assert stack.markets == ["spot"]


def test_alibabas_no_stock_is_a_capacity_error():
    err = StageError("provision", "failed", details=["ErrorCode: OperationDenied.NoStock"])
    assert capacity.capacity_error(err) == "OperationDenied.NoStock"


def test_a_group_is_never_retried_here(console):
    cfg = stack_config("aws-prod")  # its fallback is a group of its own (infra.aws.fallback)
    stack = CapacityStack()
    with pytest.raises(StageError):
        provision(cfg, stack, console)
    assert stack.markets == ["spot"]


def test_the_plan_says_what_each_stack_does_without_spot():
    dev = stack_config("aws-dev")
    assert "`torchfleet up` runs once more" in (capacity.describe(dev) or "")
    fail = dataclasses.replace(dev, spot=dataclasses.replace(dev.spot, fallback="fail"))
    assert (capacity.describe(fail) or "").startswith("spot.fallback fail: the nodes stay short")
    assert "ESS compensates" in (capacity.describe(stack_config("alicloud-prod")) or "")
    assert capacity.describe(stack_config("aws-k8s")) is None
