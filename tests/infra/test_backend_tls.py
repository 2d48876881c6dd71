"""`tls.backend`: HTTPS from the load balancer to the nodes (infra/edge.py), over the example
stacks on the mock engine: what aws-prod registers for it (HTTPS target groups and health
checks, the nodes' certificate in its own secret, the grant to read it, the node's and the
monitoring host's variables), and that the stacks without it register none of it."""

from __future__ import annotations

import json

import pytest

from infra import config, edge, inventory
from infra.bootstrap import NODE_PATHS
from infra.offline import offline_pem, run_offline

TARGET_GROUP = "aws:lb/targetGroup:TargetGroup"
SECRET = "aws:secretsmanager/secret:Secret"
VERSION = "aws:secretsmanager/secretVersion:SecretVersion"
POLICY = "aws:iam/rolePolicy:RolePolicy"


def _cfg(values: dict, stack: str) -> config.StackConfig:
    return config.load(config.raw_from_pulumi_config(values), stack)


def _problems(values: dict, stack: str) -> str:
    with pytest.raises(config.ConfigError) as err:
        _cfg(values, stack)
    return str(err.value)


def test_backend_defaults_on_in_prod_where_the_cloud_can(with_overrides, settings):
    from infra.plan import load_stack_config

    def backend(stack: str) -> bool | None:
        tls = _cfg(load_stack_config(stack), stack).tls
        return None if tls is None else tls.backend

    assert backend("aws-prod") is True
    assert backend("alicloud-prod") is False  # a CLB cannot (below)
    assert backend("aws-k8s") is False and backend("alicloud-k8s") is False
    assert backend("aws-dev") is None  # no tls block: no load balancer
    # said explicitly, it is kept either way where it is possible
    off = {**settings("aws-prod")["tls"], "backend": False}
    assert _cfg(with_overrides("aws-prod", tls=off), "aws-prod").tls.backend is False


def test_backend_is_refused_where_the_load_balancer_cannot_speak_https_to_nodes(
    with_overrides, settings
):
    tls = {**settings("alicloud-prod")["tls"], "backend": True}
    err = _problems(with_overrides("alicloud-prod", tls=tls), "alicloud-prod")
    assert "torchfleet:tls.backend = True is invalid" in err
    assert "an Alibaba CLB's HTTPS listener talks HTTP to its backends" in err
    tls = {**settings("aws-k8s")["tls"], "backend": True}
    err = _problems(with_overrides("aws-k8s", tls=tls), "aws-k8s")
    assert "torchfleet:tls.backend = True is invalid" in err and "kubernetes" in err
    tls = {**settings("aws-prod")["tls"], "backend": "yes"}
    err = _problems(with_overrides("aws-prod", tls=tls), "aws-prod")
    assert "torchfleet:tls.backend = 'yes' is invalid; allowed: true | false" in err


def _node_tls_secret(run, stack: str):
    return [s for s in run.of_type(SECRET) if s.inputs["name"] == f"torchfleet/{stack}/node-tls"]


def test_aws_prod_speaks_https_to_its_nodes_with_a_certificate_only_they_read(runs):
    run = runs["aws-prod"]
    groups = run.of_type(TARGET_GROUP)
    assert groups
    for tg in groups:
        assert tg.inputs["protocol"] == "HTTPS", tg.name
        assert tg.inputs["healthCheck"]["protocol"] == "HTTPS", tg.name
        assert tg.inputs["healthCheck"]["path"] == "/readyz"
    (secret,) = _node_tls_secret(run, "aws-prod")
    (version,) = [v for v in run.of_type(VERSION) if v.name.endswith("-node-tls")]
    assert "secretString" in version.secrets  # the key is a Pulumi secret
    doc = json.loads(version.inputs["secretString"])
    (cert,) = [
        c
        for c in run.of_type("tls:index/selfSignedCert:SelfSignedCert")
        if c.name.endswith("-node-tls")  # the journal's CA is the other one (test_journal_tls)
    ]
    assert cert.inputs["dnsNames"] == [edge.NODE_NAME]
    assert "server_auth" in cert.inputs["allowedUses"]
    assert "cert_signing" not in cert.inputs["allowedUses"]  # it signs nothing else
    assert doc["certificate"] == offline_pem("CERTIFICATE", cert.name)
    assert doc["private_key"].startswith("-----BEGIN PRIVATE KEY-----")
    # the nodes' role, and only it, reads that one secret
    arn = f"arn:aws:secretsmanager:::{secret.name}-id"
    readers = [p for p in run.of_type(POLICY) if arn in p.inputs["policy"]]
    assert [p.name for p in readers] == ["fleet-node-node-tls"]
    (statement,) = json.loads(readers[0].inputs["policy"])["Statement"]
    assert statement["Action"] == ["secretsmanager:GetSecretValue"]
    assert statement["Resource"] == [arn]
    assert readers[0].inputs["role"].endswith("node-role-id")


def test_aws_prod_nodes_and_monitoring_host_get_the_tls_variables(runs):
    run = runs["aws-prod"]
    inv = run.outputs["inventory"]
    node_vars = inv["all"]["children"][inventory.GROUP]["vars"]
    assert node_vars["inference_runtime_tls_command"] == [
        NODE_PATHS["command"],
        "node-tls",
        "torchfleet/aws-prod/node-tls",
    ]
    assert node_vars["inference_runtime_tls_cert_file"] == inventory.NODE_TLS_CERT
    assert node_vars["inference_runtime_tls_key_file"] == inventory.NODE_TLS_KEY
    (host,) = inv["all"]["children"][inventory.MONITORING_GROUP]["hosts"].values()
    (cert,) = [
        c
        for c in run.of_type("tls:index/selfSignedCert:SelfSignedCert")
        if c.name.endswith("-node-tls")
    ]
    assert host["monitoring_runtime_tls_ca"] == offline_pem("CERTIFICATE", cert.name)
    assert host["monitoring_runtime_tls_server_name"] == edge.NODE_NAME


@pytest.mark.parametrize("stack", ["aws-dev", "alicloud-prod", "alicloud-dev"])
def test_stacks_without_backend_tls_register_none_of_it(runs, stack):
    run = runs[stack]
    for tg in run.of_type(TARGET_GROUP):
        assert tg.inputs["protocol"] == "HTTP"
    assert _node_tls_secret(run, stack) == []
    assert not [p for p in run.of_type(POLICY) if "node-tls" in p.name]
    inv = run.outputs["inventory"]
    node_vars = inv["all"]["children"][inventory.GROUP].get("vars") or {}
    assert "inference_runtime_tls_command" not in node_vars
    for host in (
        inv["all"]["children"].get(inventory.MONITORING_GROUP, {}).get("hosts", {}).values()
    ):
        assert "monitoring_runtime_tls_ca" not in host


def test_backend_off_in_aws_prod_keeps_plain_http_to_the_nodes(with_overrides, settings):
    tls = {**settings("aws-prod")["tls"], "backend": False}
    run = run_offline("aws-prod", with_overrides("aws-prod", tls=tls))
    assert {tg.inputs["protocol"] for tg in run.of_type(TARGET_GROUP)} == {"HTTP"}
    assert _node_tls_secret(run, "aws-prod") == []
