"""Shared fixtures: the four example stacks run once each under the mock engine, with the
clock pinned so TTL and schedule times are reproducible."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.plan import STACKS

REPO = Path(__file__).resolve().parents[2]
PINNED_NOW = "2026-03-02T10:17:00Z"  # a Monday
os.environ["TORCHFLEET_NOW"] = PINNED_NOW  # the program reads the clock when it runs
# The reference prices, never a price API, whatever credentials the machine holds (the pricing
# tests name their mode and their fake endpoints explicitly).
os.environ["TORCHFLEET_PRICES"] = "offline"


def stack_values(stack: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"]


def settings(stack: str) -> dict[str, Any]:
    """The stack file's torchfleet: values without the prefix."""
    return {k.split(":", 1)[1]: v for k, v in stack_values(stack).items()}


def with_overrides(stack: str, **overrides: Any) -> dict[str, Any]:
    values = copy.deepcopy(stack_values(stack))
    for key, value in overrides.items():
        full = f"torchfleet:{key}"
        if value is None:
            values.pop(full, None)
        else:
            values[full] = value
    return values


def pytest_configure(config):
    # The cloud SDKs warn about their own deprecated modules when imported.
    for sdk in ("pulumi_alicloud", "pulumi_aws"):
        config.addinivalue_line("filterwarnings", f"ignore::DeprecationWarning:{sdk}.*")


# Helpers as fixtures: with --import-mode=importlib test modules cannot import conftest.
@pytest.fixture(scope="session", name="settings")
def settings_fixture():
    return settings


@pytest.fixture(scope="session", name="with_overrides")
def with_overrides_fixture():
    return with_overrides


@pytest.fixture(scope="session")
def runs():
    from infra.offline import run_offline

    return {stack: run_offline(stack, stack_values(stack)) for stack in STACKS}


@pytest.fixture(scope="session")
def every(runs):
    """Every example stack's run: the four fleets' (shared with `runs`) and the two clusters'."""
    from infra.offline import run_offline
    from infra.plan import KUBERNETES_STACKS

    return {**runs, **{s: run_offline(s, stack_values(s)) for s in KUBERNETES_STACKS}}


@pytest.fixture(params=STACKS)
def run(request, runs):
    return runs[request.param]
