"""Fixtures for the deploy-stage tests: a machine with nothing configured (no cloud
credentials, no Pulumi CLI or login, no SSH key), a fake `pulumi` that records every call, the
recorded engine events of aws-dev, and a console whose output the tests read."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.deploy.progress import Console

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
VENV_BIN = Path(sys.executable).parent
CLOUD_ENV = ("AWS_", "ALICLOUD_", "ALIBABA_CLOUD_", "PULUMI_", "SSH_AUTH_SOCK")
# The reference prices in every stage these tests run, never a price API or a cached quote.
os.environ["TORCHFLEET_PRICES"] = "offline"

FAKE_PULUMI = """#!/bin/sh
# A stand-in for the Pulumi CLI: records each call (and its working directory), answers
# `version` and `whoami`, and fails anything else loudly (a test that reaches it has created
# something) - unless FAKE_PULUMI_BACKEND=1, when `stack select|init` succeed and `up` fails the
# way the engine does when the cloud refuses.
echo "$*" >> {log}
echo "$PWD" > {log}.cwd
while [ "${{1#--}}" != "$1" ]; do shift; done
case "$1" in
  version) echo v3.272.0 ;;
  whoami) echo '{{"user":"tester","url":"file:///tmp/state"}}' ;;
  stack) [ "$FAKE_PULUMI_BACKEND" = 1 ] && exit 0
         echo "fake pulumi: refusing '$*'" >&2; exit 97 ;;
  up) [ "$FAKE_PULUMI_BACKEND" = 1 ] || exit 97
      echo "error: update failed: 1 error occurred: operation error STS: GetCallerIdentity," \\
           "https response error StatusCode: 403, api error InvalidClientTokenId" >&2
      exit 255 ;;
  *) echo "fake pulumi: refusing '$*'" >&2; exit 97 ;;
esac
"""


@pytest.fixture
def bare_machine(tmp_path, monkeypatch) -> Path:
    """HOME is empty, no cloud or Pulumi variables, PATH has no pulumi."""
    home = tmp_path / "home"
    home.mkdir()
    for key in list(os.environ):
        if key.startswith(CLOUD_ENV):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")
    return home


@pytest.fixture
def fake_pulumi(tmp_path, monkeypatch, bare_machine) -> Path:
    """A recording `pulumi` first on PATH and a self-managed backend with a passphrase; returns
    the call log."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "pulumi-calls.log"
    log.touch()
    script = bindir / "pulumi"
    script.write_text(FAKE_PULUMI.format(log=log))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{VENV_BIN}:/usr/bin:/bin")
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path / 'state'}")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "test-only")
    return log


@pytest.fixture
def ssh_key(bare_machine) -> tuple[Path, str]:
    """An ed25519 key pair in ~/.ssh; returns (private key, public line)."""
    key = bare_machine / ".ssh" / "id_ed25519"
    key.parent.mkdir(mode=0o700)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tester", "-f", str(key)],
        check=True,
        timeout=60,
    )
    return key, key.with_name("id_ed25519.pub").read_text().strip()


@pytest.fixture
def console() -> Console:
    return Console(io.StringIO(), live=False)


def text(console: Console) -> str:
    return console.stream.getvalue()  # type: ignore[attr-defined]


@pytest.fixture(name="text")
def text_fixture():
    return text


@pytest.fixture
def recorded():
    """Loader of the recorded aws-dev engine events/outputs (tests/deploy/record_engine_events.py)."""

    def load(name: str):
        return json.loads((FIXTURES / name).read_text())

    return load


@pytest.fixture
def stack_with(monkeypatch):
    """Serve Pulumi.<stack>.yaml's values, some replaced, to the preflight."""
    from infra.deploy import preflight
    from infra.plan import load_stack_config

    def patch(stack: str, **values):
        changed = {**load_stack_config(stack), **{f"torchfleet:{k}": v for k, v in values.items()}}
        monkeypatch.setattr(
            preflight,
            "load_stack_config",
            lambda name, path=None: changed if name == stack else load_stack_config(name, path),
        )

    return patch


@pytest.fixture
def aws_keys(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")


class FakeCostExplorer:
    """Records `up`'s activation of the stack cost-allocation tag (infra.spend) instead of
    calling AWS; tests/deploy/test_cost.py checks the real request against botocore's model."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def update_cost_allocation_tags_status(self, **kwargs):
        self.calls.append(kwargs)
        return {"Errors": []}


@pytest.fixture(autouse=True)
def cost_explorer(monkeypatch):
    from infra import spend

    fake = FakeCostExplorer()
    monkeypatch.setattr(spend, "ce_client", lambda: fake)
    return fake


@pytest.fixture
def trap_dirs(monkeypatch, tmp_path):
    """Run logs and inventories of `torchfleet up|down|status` in tmp_path, not the checkout."""
    from infra.deploy import pipeline

    monkeypatch.setattr(pipeline, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(pipeline, "INVENTORIES", tmp_path / "inventories")
    return tmp_path


@pytest.fixture(scope="session")
def aws_prod_outputs():
    """aws-prod's outputs under the mock engine (group mode: endpoint, discovery filter)."""
    from infra.offline import run_offline
    from infra.plan import load_stack_config

    return run_offline("aws-prod", load_stack_config("aws-prod")).outputs


@pytest.fixture
def aws_group(monkeypatch, aws_prod_outputs):
    """Mocked AWS (moto) with what aws-prod's group mode stands on: an internal ALB, its target
    group, and a 2-node Auto Scaling group carrying the stack's discovery tags. Yields aws-prod's
    outputs with the endpoint set to that ALB, and an EC2 client."""
    import boto3
    from moto import mock_aws

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    outputs = dict(aws_prod_outputs)
    region, filters = outputs["discovery"]["region"], outputs["discovery"]["filters"]
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=region)
        elb = boto3.client("elbv2", region_name=region)
        subnets = [s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]][:2]
        lb = elb.create_load_balancer(Name="fleet-alb", Subnets=subnets, Scheme="internal")[
            "LoadBalancers"
        ][0]
        tg = elb.create_target_group(
            Name="fleet-tg",
            Protocol="HTTP",
            Port=8080,
            HealthCheckPath="/readyz",
            VpcId=ec2.describe_vpcs()["Vpcs"][0]["VpcId"],
        )["TargetGroups"][0]
        elb.create_listener(
            LoadBalancerArn=lb["LoadBalancerArn"],
            Protocol="HTTP",
            Port=80,
            DefaultActions=[{"Type": "forward", "TargetGroupArn": tg["TargetGroupArn"]}],
        )
        ec2.create_launch_template(
            LaunchTemplateName="fleet-lt",
            LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "g5.xlarge"},
        )
        boto3.client("autoscaling", region_name=region).create_auto_scaling_group(
            AutoScalingGroupName="fleet-asg",
            MinSize=2,
            MaxSize=8,
            DesiredCapacity=2,
            VPCZoneIdentifier=",".join(subnets),
            LaunchTemplate={"LaunchTemplateName": "fleet-lt"},
            TargetGroupARNs=[tg["TargetGroupArn"]],
            Tags=[
                {"Key": k.removeprefix("tag:"), "Value": v, "PropagateAtLaunch": True}
                for k, v in filters.items()
                if k.startswith("tag:")
            ],
        )
        outputs["endpoint"] = f"http://{lb['DNSName']}/"
        yield outputs, ec2
