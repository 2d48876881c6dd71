"""The entry points as users run them: `python -m infra.plan`, Pulumi's directory program
(infra/__main__.py with cwd infra/), and scripts/inventory_from_stack.py feeding Ansible."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TORCHFLEET_NOW": "2026-03-02T10:17:00Z", "PYTHONPATH": str(REPO)}


def sh(*args: str, cwd: Path = REPO, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd, env=ENV, capture_output=True, text=True, input=stdin, timeout=300
    )


def plan(*args: str) -> subprocess.CompletedProcess:
    return sh(sys.executable, "-m", "infra.plan", *args)


def test_plan_prints_tree_and_costs_for_every_stack():
    out = plan("--all")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.count("OFFLINE PLAN (mock engine: nothing is created) — stack") == 6  # 2 k8s
    for needle in (
        "aws:ec2/launchTemplate:LaunchTemplate",
        "metadataOptions.httpTokens=required",
        "spotPriceLimits[0].priceLimit=",
        "healthCheckUri=/readyz",
        "COST ESTIMATE",
    ):
        assert needle in text
    table = text.split("COST ESTIMATE", 1)[1]
    for stack in (
        "aws-dev",
        "aws-prod",
        "alicloud-dev",
        "alicloud-prod",
        "aws-k8s",
        "alicloud-k8s",
    ):
        assert f"\n{stack} " in table
    # the prod stacks' hooks and load policies, and the cost at the scaling bounds
    for needle in (
        "hook torchfleet-launch (torchfleet-aws-prod-asg): autoscaling:EC2_INSTANCE_LAUNCHING",
        "hook torchfleet-launch (torchfleet-aws-prod-od-asg): autoscaling:EC2_INSTANCE_LAUNCHING",
        "when spot cannot be had: spot.fallback on_demand: torchfleet-aws-prod-od-asg (on-demand",
        "when spot cannot be had: spot.fallback on_demand: after a spot capacity error",
        "policy torchfleet-aws-prod-od-fill: step scaling of torchfleet-aws-prod-od-asg on its "
        "alarm (torchfleet aws-prod: spot group short for 5 min: add on-demand nodes)",
        "hook torchfleet-terminate: SCALE_IN, CONTINUE",
        "target tracking ALBRequestCountPerTarget = 1200",
        "target tracking torchfleet/QueueDepth (Minimum)",
        "target tracking torchfleet/GpuUtilization (Minimum) = 70",
        "GpuUtilization >= 70.0",
        " && GpuUtilization < ",
        "torchfleet_gpu_utilization_ratio = 700m",
        "RequestRate >= 20.0",
        "RequestRate < ",
        " && QueueDepth < ",
        "health LOAD_BALANCER",
        "bundle_url: s3://",
        "bundle_url: oss://",
    ):
        assert needle in text, needle
    bounds = table.split("at the scaling bounds", 1)[1]
    row = next(line for line in bounds.splitlines() if line.startswith("aws-prod "))
    assert row.split()[1:3] == ["2", "8"]  # min and max nodes, each with its monthly cost
    assert "CLUSTER COST" in table


def test_plan_refuses_bad_config(tmp_path):
    bad = yaml.safe_load((REPO / "Pulumi.aws-dev.yaml").read_text())
    bad["config"]["torchfleet:cuda_profile"] = "cu116"
    bad["config"]["torchfleet:admin_cidrs"] = ["0.0.0.0/0"]
    path = tmp_path / "Pulumi.aws-dev.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = plan("aws-dev", "--config", str(path))
    assert out.returncode == 2
    assert "torchfleet:cuda_profile = 'cu116'" in out.stderr
    assert "torchfleet:admin_cidrs = '0.0.0.0/0'" in out.stderr
    assert "LaunchTemplate" not in out.stdout


def test_plan_json_lists_resources():
    out = plan("alicloud-dev", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    types = [r["type"] for r in data["resources"] if r["custom"]]
    assert types.count("alicloud:ecs/instance:Instance") == 2


PULUMI_STYLE = """
import runpy, sys, pulumi
sys.path[:] = [p for p in sys.path if p not in ('', {repo!r})]
from pulumi.runtime.mocks import MockMonitor
class M(pulumi.runtime.Mocks):
    def new_resource(self, args):
        out = dict(args.inputs)
        out.update(publicIp='203.0.113.5', privateIp='10.42.0.5', latestVersion=1)
        out.setdefault('bucket', args.name + '-bucket')  # a bucket named by prefix
        return args.name + '-id', out
    def call(self, args):
        return {{'id': 'ami-0123456789abcdef0', 'accountId': '123456789012'}}
mon = MockMonitor(M())
pulumi.runtime.set_mocks(M(), project='torchfleet', stack='aws-dev', preview=False, monitor=mon)
pulumi.runtime.set_all_config({config!r})
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await
_sync_await(run_pulumi_func(lambda: runpy.run_path('.', run_name='__main__')))
print('registered', len(mon.resources))
"""


def test_pulumi_runs_the_directory_program(tmp_path):
    values = yaml.safe_load((REPO / "Pulumi.aws-dev.yaml").read_text())["config"]
    config = {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}
    script = tmp_path / "pulumi_style.py"
    script.write_text(PULUMI_STYLE.format(repo=str(REPO), config=config))
    env = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}  # as Pulumi would: no repo path
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO / "infra",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    count = int(out.stdout.strip().rsplit(" ", 1)[1])
    assert count >= 20


@pytest.fixture(scope="module")
def outputs_files(tmp_path_factory, runs):
    folder = tmp_path_factory.mktemp("outputs")
    files = {}
    for stack in ("aws-dev", "alicloud-prod"):
        files[stack] = folder / f"{stack}.json"
        files[stack].write_text(json.dumps(runs[stack].outputs))
    return files


def ansible_inventory(path: Path) -> dict:
    binary = shutil.which("ansible-inventory", path=str(REPO / ".venv" / "bin"))
    assert binary, "ansible-inventory is part of the repo's virtualenv"
    out = subprocess.run(
        [binary, "-i", str(path), "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**ENV, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true"},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_inventory_script_instances_mode(tmp_path, outputs_files, runs):
    out = sh(
        sys.executable,
        "scripts/inventory_from_stack.py",
        "aws-dev",
        "--input",
        str(outputs_files["aws-dev"]),
        "--out-dir",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    stack_yml = tmp_path / "aws-dev" / "stack.yml"
    assert stack_yml.read_text().startswith("# Generated by scripts/inventory_from_stack.py")
    parsed = ansible_inventory(stack_yml)
    assert parsed["gpu_nodes"]["hosts"] == ["aws-dev-gpu-0"]
    hostvars = parsed["_meta"]["hostvars"]["aws-dev-gpu-0"]
    expected = runs["aws-dev"].outputs["inventory"]["all"]["children"]["gpu_nodes"]["hosts"]
    assert hostvars == expected["aws-dev-gpu-0"]
    assert (
        hostvars["torchfleet_gpu_model"] == "L4" and hostvars["torchfleet_cuda_profile"] == "cu121"
    )


def test_inventory_script_group_mode_from_stdin(tmp_path, outputs_files):
    out = sh(
        sys.executable,
        "scripts/inventory_from_stack.py",
        "alicloud-prod",
        "--input",
        "-",
        "--out-dir",
        str(tmp_path),
        stdin=outputs_files["alicloud-prod"].read_text(),
    )
    assert out.returncode == 0, out.stderr
    assert "group mode" in out.stdout
    parsed = ansible_inventory(tmp_path / "alicloud-prod" / "stack.yml")
    assert "gpu_nodes" in parsed["all"]["children"]  # an empty group until discovery fills it
    data = yaml.safe_load((tmp_path / "alicloud-prod" / "stack.yml").read_text())
    assert data["all"]["vars"]["torchfleet_discovery"]["tags"]["stack"] == "alicloud-prod"
    assert data["all"]["children"]["gpu_nodes"]["vars"]["torchfleet_gpu_model"] == "T4"


def test_inventory_script_rejects_foreign_outputs(tmp_path):
    src = tmp_path / "other.json"
    src.write_text(json.dumps({"url": "http://example.com"}))
    out = sh(
        sys.executable,
        "scripts/inventory_from_stack.py",
        "aws-dev",
        "--input",
        str(src),
        "--out-dir",
        str(tmp_path),
    )
    assert out.returncode == 1 and "no `inventory`" in out.stderr
    assert not (tmp_path / "aws-dev").exists()


def test_plan_of_a_bake(capsys, runs):
    """What `make bake STACK=...` shows before it runs `pulumi up` (in-process: the entry
    point itself is covered above)."""
    from infra.plan import main

    assert main(["aws-prod", "--boot", "bake"]) == 0
    text = capsys.readouterr().out
    for needle in (
        "torchfleet:aws:Bake",
        "aws:imagebuilder/image:Image",
        "policyArn=arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder",
        "imageId=ami-0fedcba9876543210",
    ):  # the group launches the baked AMI
        assert needle in text, needle
    assert main(["alicloud-prod", "--boot", "bake"]) == 2
    assert "torchfleet:boot = 'bake'" in capsys.readouterr().err


def test_one_table_renderer_lines_up_every_value_under_its_heading():
    from infra.plan import Column, table

    columns = (
        Column("stack", 12, "stack", left=True),
        Column("nodes", 5, "nodes"),
        Column("/h cap", 8, "cap", ".3f"),
        Column("od/spot", 7, lambda row: f"{row['od']}/{row['spot']}"),
        Column("monitoring", 10, lambda row: row.get("host") or "-", left=True),
    )
    rows = {
        "aws-dev": {"nodes": 3, "cap": 0.1254, "od": 1, "spot": 2, "host": "t3.small"},
        "alicloud-dev": {"nodes": 12, "cap": 1234.5, "od": 0, "spot": 12},
    }
    head, rule, *lines = table(columns, rows)
    assert head == "stack        nodes   /h cap od/spot monitoring"
    assert rule == "-" * len(head)
    assert lines == [
        "aws-dev          3    0.125     1/2 t3.small  ",
        "alicloud-dev    12 1234.500    0/12 -         ",
    ]
