"""Leave before the reclaim: the node agent takes its node out of the load balancer with the
node's own credentials, then drains. AWS through boto3 against moto's ELBv2 and Secrets Manager;
Alibaba through the OpenAPI SDK against the signature-checking fake (SLB, KMS)."""

from __future__ import annotations

import grp
import json
import os
from typing import Any

import boto3
import pytest
from fake_alibaba import FakeAlibaba, role_credentials
from moto import mock_aws

from infra.bootstrap.torchfleet_agent import boot, cli, leave, local, secret_files
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
    assert cloud.secret_string("torchfleet/aws-prod/api-token") == "tok-a\ntok-b"


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
    assert secret_files.write_file(str(dest), "tok-current\ntok-next") is True
    assert dest.stat().st_mode & 0o777 == 0o640
    assert secret_files.write_file(str(dest), "tok-current\ntok-next\n") is False


def test_the_node_tls_command_writes_the_certificate_and_key_for_the_service_group(
    aws, tmp_path, monkeypatch, capsys
):
    """`torchfleet-node node-tls` (a stack with tls.backend; the inference_runtime role's
    inference_runtime_tls_command): the nodes' certificate and key from their secret, each
    0640 and of the service's group (root's, as root), replaced only when they changed."""
    name = "torchfleet/aws-prod/node-tls"
    doc = {"certificate": "-----BEGIN CERTIFICATE-----\nA\n", "private_key": "KEY-1"}
    sm = boto3.client("secretsmanager", region_name=REGION)
    sm.create_secret(Name=name, SecretString=json.dumps(doc))
    monkeypatch.setattr(boot, "load_config", lambda: {"cloud": "aws", "region": REGION})
    cert, key = tmp_path / "node-cert.pem", tmp_path / "node-key.pem"
    group = grp.getgrgid(os.getgid()).gr_name
    argv = [name, str(cert), str(key), group]

    assert cli.node_tls(argv) == 0
    assert " written to " in capsys.readouterr().out  # the role restarts the runtime on it
    assert cert.read_text() == doc["certificate"] and key.read_text() == "KEY-1\n"
    for path in (cert, key):
        st = path.stat()
        assert st.st_mode & 0o7777 == 0o640 and st.st_gid == os.getgid()
        assert os.geteuid() != 0 or st.st_uid == 0
    first = key.stat().st_ino
    assert cli.node_tls(argv) == 0
    assert capsys.readouterr().out == ""  # unchanged: nothing written, no restart
    assert key.stat().st_ino == first

    sm.put_secret_value(SecretId=name, SecretString=json.dumps({**doc, "private_key": "KEY-2"}))
    assert cli.node_tls(argv) == 0
    assert " written to " in capsys.readouterr().out and key.read_text() == "KEY-2\n"
    assert cli.node_tls([name]) == 2  # usage


def test_the_journal_tls_command_writes_the_three_files_root_only_and_only_on_change(
    aws, tmp_path, monkeypatch, capsys
):
    """`torchfleet-node journal-tls SECRET CERT KEY CA` (the monitoring role's
    monitoring_logs_tls_command on a node): the client certificate, key and the journal CA from
    the nodes' secret, 0640 root-owned, replaced only when they changed (an unchanged secret
    prints nothing: no journal-upload restart), a malformed secret refused before any file is
    touched, the key never printed."""
    name = "torchfleet/aws-prod/journal-node"
    doc = {"certificate": "CERT-1", "private_key": "KEY-1", "ca": "CA-1"}
    sm = boto3.client("secretsmanager", region_name=REGION)
    sm.create_secret(Name=name, SecretString=json.dumps(doc))
    monkeypatch.setattr(boot, "load_config", lambda: {"cloud": "aws", "region": REGION})
    files = [tmp_path / n for n in ("cert.pem", "key.pem", "ca.pem")]
    argv = [name, *map(str, files)]

    assert cli.main(["journal-tls", *argv]) == 0
    out = capsys.readouterr().out
    assert f" written to {files[0]}, {files[1]}, {files[2]}" in out and "KEY-1" not in out
    assert [f.read_text() for f in files] == ["CERT-1\n", "KEY-1\n", "CA-1\n"]
    for path in files:
        st = path.stat()
        assert st.st_mode & 0o7777 == 0o640 and st.st_gid == os.getegid()
        assert os.geteuid() != 0 or st.st_uid == 0
    inodes = [f.stat().st_ino for f in files]
    assert cli.journal_tls(argv) == 0
    assert capsys.readouterr().out == ""  # unchanged: nothing written, no restart
    assert [f.stat().st_ino for f in files] == inodes

    sm.put_secret_value(SecretId=name, SecretString=json.dumps({**doc, "ca": "CA-2"}))
    assert cli.journal_tls(argv) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f" written to {files[2]}"), out  # the CA alone was replaced
    assert files[2].read_text() == "CA-2\n" and files[0].stat().st_ino == inodes[0]

    sm.put_secret_value(SecretId=name, SecretString=json.dumps({"certificate": "CERT-3"}))
    with pytest.raises(ValueError, match="private_key, ca is invalid .*allowed: a JSON document"):
        cli.journal_tls(argv)
    assert files[0].read_text() == "CERT-1\n"  # checked before any file was touched

    assert cli.journal_tls(argv[:3]) == 2  # usage, naming the default paths
    assert local.JOURNAL_TLS_CERT in capsys.readouterr().err
    for path in (local.JOURNAL_TLS_CERT, local.JOURNAL_TLS_KEY, local.JOURNAL_TLS_CA):
        assert os.path.dirname(path) == local.JOURNAL_TLS_DIR


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
    """SLB and KMS as far as a leaving node calls them. SetVServerGroupAttribute answers as the
    cloud does: only a server already in the VServer group at that port can be set, and a
    weight is 0..100."""

    def __init__(self) -> None:
        self.backends = {("rsp-backends", "i-node1", "8080"): "50"}

    def __call__(self, action: str, params: dict[str, str]) -> dict[str, Any]:
        if action == "GetSecretValue":
            return {"SecretName": params["SecretName"], "SecretData": "tok-a\ntok-b"}
        if action == "SetVServerGroupAttribute":
            group = params["VServerGroupId"]
            for server in json.loads(params["BackendServers"]):
                key = (group, server["ServerId"], server["Port"])
                if key not in self.backends or not 0 <= int(server["Weight"]) <= 100:
                    return {"Code": "BackendServer.configuring", "Message": f"{key}"}
                self.backends[key] = server["Weight"]
            return {"VServerGroupId": group}
        return {}


METADATA = {
    "instance-id": "i-node1",
    "instance/spot/termination-time": "2026-03-02T10:22:00Z",
    "ram/security-credentials/": "torchfleet-node",
    "ram/security-credentials/torchfleet-node": role_credentials(),
}


def test_an_alibaba_node_sets_its_vserver_group_weight_to_zero_then_drains():
    slb = Slb()
    with FakeAlibaba(slb, METADATA) as fake:
        cfg = {
            "cloud": "alicloud",
            "region": "cn-shanghai",
            "load_balancer_id": "lb-clb1",
            "vserver_group_id": "rsp-backends",
            "service_port": 8080,
            "endpoints": {k: fake.url for k in ("imds", "slb", "kms")},
        }
        cloud = cloud_of(cfg)  # type: ignore[arg-type]
        assert cloud.spot_notice() == "2026-03-02T10:22:00Z"
        order: list[str] = []
        balancer = cloud.balancer("i-node1")
        assert balancer is not None and "rsp-backends" in balancer.describe()
        leave.leave_then_drain(balancer, lambda: order.append(fake.actions()[-1]), 0, "spot")
        assert cloud.secret_string("torchfleet-alicloud-prod-api-token") == "tok-a\ntok-b"
    (call,) = [c for c in fake.calls if c["action"] == "SetVServerGroupAttribute"]
    assert call["version"] == "2014-05-15" and call["params"]["VServerGroupId"] == "rsp-backends"
    assert json.loads(call["params"]["BackendServers"]) == [
        {"ServerId": "i-node1", "Port": "8080", "Weight": "0", "Type": "ecs"}
    ]
    assert slb.backends[("rsp-backends", "i-node1", "8080")] == "0"
    assert order == ["SetVServerGroupAttribute"]  # weight 0 before the drain
    # the default server group's call is gone: the listeners no longer forward there
    assert "SetBackendServers" not in fake.actions()
    (kms,) = [c for c in fake.calls if c["action"] == "GetSecretValue"]
    assert kms["version"] == "2016-01-20" and fake.refused == []


def test_an_alibaba_node_without_its_vserver_group_leaves_nothing():
    """A node config from before the VServer group (load_balancer_id alone): nothing to leave
    that the listeners still use, so the drain goes ahead without a call."""
    cloud = cloud_of(
        {"cloud": "alicloud", "region": "cn-shanghai", "load_balancer_id": "lb-clb1"}  # type: ignore[arg-type]
    )
    assert cloud.balancer("i-node1") is None


def test_an_alibaba_leave_the_cloud_refuses_is_logged_and_the_drain_goes_ahead(capsys):
    """The wrong port (not the one ESS attached the node at): SLB refuses, the agent says so."""
    with FakeAlibaba(Slb(), METADATA) as fake:
        cloud = cloud_of(
            {  # type: ignore[arg-type]
                "cloud": "alicloud",
                "region": "cn-shanghai",
                "load_balancer_id": "lb-clb1",
                "vserver_group_id": "rsp-backends",
                "service_port": 9000,
                "endpoints": {k: fake.url for k in ("imds", "slb")},
            }
        )
        drained: list[bool] = []
        balancer = cloud.balancer("i-node1")
        assert balancer is not None
        assert leave.leave_then_drain(balancer, lambda: drained.append(True), 0, "spot") is False
    assert drained == [True] and fake.actions() == ["SetVServerGroupAttribute"]
    assert "could not leave VServer group rsp-backends" in capsys.readouterr().out
