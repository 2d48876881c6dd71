"""The rollout table (infra/rollout/clouds.py): one entry per cloud the stack config allows, each
looked up by the stack's cloud, what a rollout there uses."""

from __future__ import annotations

import dataclasses

import pytest

from infra import config
from infra.rollout import clouds, signals
from infra.rollout.errors import RolloutError
from infra.rollout.refresh import AsgRefresh, EssRoll
from infra.stacks import load_stack_config


def _cfg(stack: str) -> config.StackConfig:
    raw = {k.split(":", 1)[1]: v for k, v in load_stack_config(stack).items()}
    return config.load(raw, stack)


def test_every_cloud_the_config_allows_has_a_rollout_table():
    assert set(clouds.CLOUDS) == set(config.CLOUDS)
    assert all(t.cloud == name for name, t in clouds.CLOUDS.items())


@pytest.mark.parametrize(
    ("stack", "figures", "refresh", "limit"),
    [
        ("aws-prod", signals.CloudWatchSource, AsgRefresh, 100),
        # alicloud-prod: nodes min 2, max 6: the VServer group's weights reach 80 % at most
        ("alicloud-prod", signals.CloudMonitorSource, EssRoll, 80),
    ],
)
def test_a_group_stack_gets_its_clouds_figures_refresh_and_limit(
    stack, figures, refresh, limit, monkeypatch
):
    # the refresh builds its cloud client: fake keys, so botocore never asks this machine's IMDS
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE"),
        ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ):
        monkeypatch.setenv(name, value)
    cfg = _cfg(stack)
    table = clouds.rollout_of(cfg)
    assert table.figures is figures and table.needs_prometheus(cfg) is None
    assert isinstance(table.refresh(cfg, print), refresh)
    assert table.limit(cfg) == limit == table.group_limit(cfg)
    assert table.targeted_step


def test_a_kubernetes_stack_needs_prometheus_and_stops_below_100():
    cfg = dataclasses.replace(_cfg("aws-prod"), mode="kubernetes")
    table = clouds.rollout_of(cfg)
    assert table.limit(cfg) == clouds.KUBERNETES_LIMIT
    says = table.needs_prometheus(cfg)
    assert says is not None and "the NLB's in CloudWatch are per listener" in says


def test_a_cloud_without_a_table_is_a_rollout_error():
    cfg = dataclasses.replace(_cfg("aws-prod"), cloud="gcp")
    with pytest.raises(
        RolloutError, match="no rollout table for cloud 'gcp'; built: aws, alicloud"
    ):
        clouds.rollout_of(cfg)
