"""`down` and `status` through the CLI (the Automation API replaced by a recorded stack), and
the group-mode node stages against mocked AWS APIs."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from pulumi.automation import EngineEvent

from infra import cli, client
from infra import config as stack_config
from infra.deploy import automation, inventory, pipeline, readiness
from infra.deploy.progress import Console
from infra.deploy.readiness import NodeState
from infra.deploy.stage import StageError
from infra.plan import load_stack_config


class Recorded:
    def __init__(self, events=(), outputs=None):
        self.events, self.saved, self.calls = list(events), outputs or {}, []

    def destroy(self, on_event=None, on_output=None, **kwargs):
        self.calls.append("destroy")
        for raw in self.events:
            on_event(EngineEvent.from_json(raw))

    def outputs(self):
        self.calls.append("outputs")
        from pulumi.automation import OutputValue

        return {k: OutputValue(v["value"], v["secret"]) for k, v in self.saved.items()}


def delete_events(recorded):
    """The recorded create events turned into the deletes a destroy streams."""
    out = []
    for e in recorded("aws-dev.up.events.json"):
        for kind in ("resourcePreEvent", "resOutputsEvent"):
            if kind in e:
                e[kind]["metadata"]["op"] = "delete"
        if "summaryEvent" in e:
            e["summaryEvent"]["resourceChanges"] = {"delete": 22}
        out.append(e)
    return out


def test_down_destroys_and_removes_the_stale_inventory(
    fake_pulumi, aws_keys, trap_dirs, recorded, monkeypatch, capsys
):
    stack = Recorded(delete_events(recorded))
    monkeypatch.setattr(automation, "open_stack", lambda name: stack)
    inv = recorded("aws-dev.up.outputs.json")["inventory"]["value"]
    stale = inventory.write("aws-dev", inv, trap_dirs / "inventories")
    assert cli.main(["down", "aws-dev"]) == 0
    out = capsys.readouterr().out
    assert stack.calls == ["destroy"]
    assert "deleted  aws:ec2/instance:Instance  fleet-node-0" in out
    assert "22 deleted in 1 min 34 s" in out
    assert not stale.exists() and "stack aws-dev destroyed" in out


def test_down_of_prod_goes_ahead_with_yes(fake_pulumi, aws_keys, trap_dirs, monkeypatch, capsys):
    stack = Recorded()
    monkeypatch.setattr(automation, "open_stack", lambda name: stack)
    assert cli.main(["down", "aws-prod", "--yes"]) == 0
    assert stack.calls == ["destroy"]


def test_status_reports_each_node_and_exits_7_when_one_is_not_ready(
    fake_pulumi, ssh_key, stack_with, trap_dirs, recorded, monkeypatch, capsys
):
    stack_with("aws-dev", ssh_public_key=ssh_key[1])
    stack = Recorded(outputs=recorded("aws-dev.up.outputs.json"))
    monkeypatch.setattr(automation, "open_stack", lambda name: stack)
    seen = []

    def probe(target, port, auth=None):
        seen.append((target.host, target.address, target.user, target.key_file, port))
        return NodeState(target.host, target.address, readyz=503)

    monkeypatch.setattr(readiness, "probe", probe)
    assert cli.main(["status", "aws-dev"]) == 7
    out = capsys.readouterr().out
    assert stack.calls == ["outputs"]
    host = recorded("aws-dev.up.outputs.json")["inventory"]["value"]["all"]["children"][
        "gpu_nodes"
    ]["hosts"]["aws-dev-gpu-0"]
    assert seen == [("aws-dev-gpu-0", host["ansible_host"], "ubuntu", str(ssh_key[0]), 8080)]
    assert "NOT ready (/readyz 503)" in out
    assert "cost now" in out and "ttl" in out


def test_group_mode_waits_for_the_healthy_count_then_predicts_through_the_load_balancer(
    aws_group, tmp_path, monkeypatch
):
    """aws-prod's outputs, its endpoint a mocked internal ALB with two healthy nodes: no
    converge from here, readiness from the target health, then the smoke prediction, which from
    outside the VPC cannot reach the load balancer and says so."""
    outputs, _ = aws_group
    asked = []

    def unreachable(method, url, *args, **kwargs):  # no DNS lookup of a mocked ALB's name
        asked.append(f"{method} {url}")
        return None, b"", 0.0

    monkeypatch.setattr(client, "request", unreachable)
    monkeypatch.setattr(pipeline, "GROUP_READY_TIMEOUT_S", 5.0)
    console = Console(io.StringIO(), live=False)
    cfg = stack_config.load(
        stack_config.raw_from_pulumi_config(load_stack_config("aws-prod")), "aws-prod"
    )
    with pytest.raises(StageError) as info:
        pipeline.node_stages(
            "aws-prod",
            outputs,
            cfg,
            pipeline.Steps(console, 4),
            console,
            tmp_path,
            pipeline.NodeOptions(inventory_root=tmp_path / "inv"),
        )
    shown = console.stream.getvalue()
    assert "no hosts (group mode: the nodes are found by tag)" in shown
    assert "each node converges itself" in shown
    assert "2/2 healthy targets" in shown
    assert info.value.stage == "smoke" and info.value.exit_code == 8
    assert "internal load balancer" in info.value.fix
    assert asked == [f"GET {outputs['endpoint']}v1/model"]  # straight to the load balancer


def test_the_console_script_is_installed_and_documents_its_exit_codes():
    script = Path(sys.executable).parent / "torchfleet"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for needle in ("up", "down", "status", "plan", "demo", "3 preflight", "9 refused"):
        assert needle in out.stdout


def test_plan_is_the_offline_plan(capsys):
    assert cli.main(["plan", "alicloud-dev"]) == 0
    out = capsys.readouterr().out
    assert "OFFLINE PLAN (mock engine: nothing is created) — stack alicloud-dev" in out
    assert "COST ESTIMATE" in out


def test_demo_refuses_a_container_prefix_that_is_not_the_demos(monkeypatch, capsys):
    monkeypatch.setenv("TORCHFLEET_DEMO_PREFIX", "molecule-")
    assert cli.main(["demo", "--clean"]) == 9
    assert "must start with 'torchfleet-demo-'" in capsys.readouterr().out
