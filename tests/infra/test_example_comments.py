"""What an example stack's comments say its monitoring host does is what the monitoring role
decides for that stack: the role's own `monitoring_discovery` expression
(roles/monitoring/defaults/main.yml), rendered with the inventory the stack's plan outputs."""

from __future__ import annotations

from pathlib import Path

import jinja2
import yaml

from infra.config import load, raw_from_pulumi_config
from infra.plan import load_stack_config

REPO = Path(__file__).resolve().parents[2]
# how the comments name each discovery, by cloud
PHRASES = {
    ("aws", "ec2"): "EC2 discovery on AWS",
    ("alicloud", "ecs"): "ECS listing on Alibaba",
    ("alicloud", "file"): "the inventory on Alibaba",
}


def discovery(cloud: str, inventory: dict) -> str:
    defaults = yaml.safe_load((REPO / "roles/monitoring/defaults/main.yml").read_text())
    host_vars = {**(inventory["all"].get("vars") or {}), "torchfleet_cloud": cloud}
    return jinja2.Environment().from_string(defaults["monitoring_discovery"]).render(host_vars)


def test_a_stacks_comment_names_the_discovery_its_monitoring_host_runs(runs):
    checked = 0
    for stack, run in sorted(runs.items()):
        cfg = load(raw_from_pulumi_config(load_stack_config(stack)), stack)
        if cfg.mode == "kubernetes" or cfg.monitoring is None:
            continue
        method = discovery(cfg.cloud, run.outputs["inventory"]).strip()
        text = (REPO / f"Pulumi.{stack}.yaml").read_text()
        comments = " ".join(
            " ".join(line.split("#", 1)[1].split()) for line in text.splitlines() if "#" in line
        )
        if "monitoring host" not in comments:
            continue
        checked += 1
        assert PHRASES[(cfg.cloud, method)] in comments, (
            f"Pulumi.{stack}.yaml: its monitoring host discovers nodes by {method!r} "
            f"(roles/monitoring/defaults/main.yml); say {PHRASES[(cfg.cloud, method)]!r}"
        )
    assert checked >= 2, "no example describes its monitoring host: is the test still reading them?"
