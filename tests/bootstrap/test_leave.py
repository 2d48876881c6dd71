"""Leave before the reclaim: the node agent takes its node out of the load balancer with the
node's own credentials, then drains. AWS through boto3 against moto's ELBv2 and Secrets Manager;
Alibaba through the OpenAPI SDK against the signature-checking fake (SLB, KMS)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from fake_alibaba import FakeAlibaba, role_credentials
from moto import mock_aws

from infra.bootstrap.torchfleet_agent import boot, cli, leave
from infra.bootstrap.torchfleet_agent.cloud import cloud_of

REGION = "us-east-1"


@pytest.fixture
def aws(monkeypatch):
    for key, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", REGION),
    ):
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


def _target_group_with_two_nodes() -> tuple[str, list[str]]:
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    image = ec2.describe_images()["Images"][0]["ImageId"]
    ids = [
        i["InstanceId"]
        for i in ec2.run_instances(ImageId=image, MinCount=2, MaxCount=2)["Instances"]
    ]
    elb = boto3.client("elbv2", region_name=REGION)
    arn = elb.create_target_group(Name="torchfleet-tg", Protocol="HTTP", Port=8080, VpcId=vpc)[
        "TargetGroups"
    ][0]["TargetGroupArn"]
    elb.register_targets(TargetGroupArn=arn, Targets=[{"Id": i} for i in ids])
    return arn, ids


def test_an_aws_node_deregisters_itself_from_its_target_group_then_drains(aws):
    arn, (leaving, staying) = _target_group_with_two_nodes()
    cloud = cloud_of({"cloud": "aws", "region": REGION, "target_group_arn": arn})
    order: list[str] = []
    balancer = cloud.balancer(leaving)
    assert balancer is not None and "torchfleet-tg" in balancer.describe()

    def drain() -> None:
        health = boto3.client("elbv2", region_name=REGION).describe_target_health(
            TargetGroupArn=arn
        )["TargetHealthDescriptions"]
        order.append("drain with " + ",".join(sorted(d["Target"]["Id"] for d in health)))

    assert leave.leave_then_drain(balancer, drain, 0, "spot notice") is True
    assert order == [f"drain with {staying}"]  # out of the group before the drain began
    # a node outside a group (instances mode) has nothing to leave
    assert cloud_of({"cloud": "aws", "region": REGION}).balancer(leaving) is None


def test_an_aws_node_reads_the_stacks_api_tokens_with_its_own_credentials(aws):
    sm = boto3.client("secretsmanager", region_name=REGION)
    sm.create_secret(Name="torchfleet/aws-prod/api-token", SecretString="tok-a\ntok-b")
    cloud = cloud_of({"cloud": "aws", "region": REGION})
    assert cloud.api_tokens("torchfleet/aws-prod/api-token") == "tok-a\ntok-b"


def test_the_api_token_command_replaces_the_file_only_when_the_secret_changed(
    aws, tmp_path, monkeypatch
):
    """What the role's timer runs on every node: a rotation's next token reaches a group's
    running nodes, and an unchanged secret leaves the file (its inode) alone."""
    name = "torchfleet/aws-prod/api-token"
    sm = boto3.client("secretsmanager", region_name=REGION)
    sm.create_secret(Name=name, SecretString="tok-current")
    cfg = {"cloud": "aws", "region": REGION, "api_token_secret": name}
    monkeypatch.setattr(boot, "load_config", lambda: cfg)
    dest = tmp_path / "api-tokens"

    assert cli.api_token([str(dest)]) == 0
    first = dest.stat()
    assert dest.read_text() == "tok-current\n" and first.st_mode & 0o777 == 0o640
    assert cli.api_token([str(dest)]) == 0
    assert dest.stat().st_ino == first.st_ino  # not rewritten: the runtime re-reads nothing

    sm.put_secret_value(SecretId=name, SecretString="tok-current\ntok-next")  # rotate-token
    assert cli.api_token([str(dest)]) == 0
    assert dest.read_text() == "tok-current\ntok-next\n"
    assert dest.stat().st_ino != first.st_ino  # replaced whole: never seen half-written
    assert not (tmp_path / "api-tokens.tmp").exists()

    dest.chmod(0o644)  # a wrong mode alone is repaired
    assert cli.write_tokens(str(dest), "tok-current\ntok-next") is True
    assert dest.stat().st_mode & 0o777 == 0o640
    assert cli.write_tokens(str(dest), "tok-current\ntok-next\n") is False


def test_a_failed_leave_still_drains_and_says_so(capsys):
    class Broken:
        def describe(self) -> str:
            return "a balancer"

        def leave(self) -> None:
            raise OSError("unreachable")

    drained: list[bool] = []
    assert leave.leave_then_drain(Broken(), lambda: drained.append(True), 5, "spot") is False
    assert drained == [True]
    assert "could not leave a balancer (unreachable); draining now" in capsys.readouterr().out


class Slb:
    def __call__(self, action: str, params: dict[str, str]) -> dict[str, Any]:
        if action == "GetSecretValue":
            return {"SecretName": params["SecretName"], "SecretData": "tok-a\ntok-b"}
        return {}


METADATA = {
    "instance-id": "i-node1",
    "instance/spot/termination-time": "2026-03-02T10:22:00Z",
    "ram/security-credentials/": "torchfleet-node",
    "ram/security-credentials/torchfleet-node": role_credentials(),
}


def test_an_alibaba_node_sets_its_clb_weight_to_zero_then_drains():
    with FakeAlibaba(Slb(), METADATA) as fake:
        cfg = {
            "cloud": "alicloud",
            "region": "cn-shanghai",
            "load_balancer_id": "lb-clb1",
            "endpoints": {k: fake.url for k in ("imds", "slb", "kms")},
        }
        cloud = cloud_of(cfg)  # type: ignore[arg-type]
        assert cloud.spot_notice() == "2026-03-02T10:22:00Z"
        order: list[str] = []
        leave.leave_then_drain(
            cloud.balancer("i-node1"), lambda: order.append(fake.actions()[-1]), 0, "spot"
        )
        assert cloud.api_tokens("torchfleet-alicloud-prod-api-token") == "tok-a\ntok-b"
    (call,) = [c for c in fake.calls if c["action"] == "SetBackendServers"]
    assert call["version"] == "2014-05-15" and call["params"]["LoadBalancerId"] == "lb-clb1"
    assert json.loads(call["params"]["BackendServers"]) == [
        {"ServerId": "i-node1", "Weight": "0", "Type": "ecs"}
    ]
    assert order == ["SetBackendServers"]  # weight 0 before the drain
    (kms,) = [c for c in fake.calls if c["action"] == "GetSecretValue"]
    assert kms["version"] == "2016-01-20" and fake.refused == []
