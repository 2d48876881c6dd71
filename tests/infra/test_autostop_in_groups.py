"""Autostop where it saves money: a lone dev instance stops itself when idle; a node of a group
never does (the group would start a replacement at once), whatever the environment."""

from __future__ import annotations

import yaml

from infra import config, inventory
from infra.matrix import REPO_ROOT as REPO


def _group_vars(stack: str, values) -> dict:
    cfg = config.load(config.raw_from_pulumi_config(values), stack)
    return inventory.group_vars(cfg, "ubuntu")


def test_a_group_s_nodes_never_power_themselves_off(with_overrides, settings):
    dev_group = with_overrides("aws-dev", mode="group", scaling=settings("aws-prod")["scaling"])
    assert _group_vars("aws-dev", dev_group)["autostop_enabled"] is False
    prod = with_overrides("alicloud-prod")
    assert _group_vars("alicloud-prod", prod)["autostop_enabled"] is False
    # instances: the role's own default decides (on in dev: roles/autostop/defaults/main.yml)
    assert "autostop_enabled" not in _group_vars("aws-dev", with_overrides("aws-dev"))
    defaults = REPO / "roles" / "autostop" / "defaults" / "main.yml"
    default = yaml.safe_load(defaults.read_text())["autostop_enabled"]
    assert "torchfleet_env" in default and "'dev'" in default


def test_the_node_bundle_carries_it():
    """A group node configures itself from the bundle's node.json (infra.bundle): the example
    prod group's node.json turns autostop off too, the dev instances' leaves it to the role."""
    from infra import bundle

    assert bundle.stack_facts("aws-prod")["group_vars"]["autostop_enabled"] is False
    assert "autostop_enabled" not in bundle.stack_facts("aws-dev")["group_vars"]
