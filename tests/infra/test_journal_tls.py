"""The journal's HTTPS as a stack with `monitoring.enabled` delivers it (infra/monitoring.py's
journal_tls), over the two prod examples on the mock engine: the journal CA signs exactly the
receiver's server certificate (for the monitoring host's fixed address and name) and the nodes'
client certificate; each end's certificate, key and CA sit in its own cloud secret, which only
that end's role may read; the inventory (and so the node bundle) tells each end where to read
it. The reading itself: tests/bootstrap/test_leave.py (the agent's `journal-tls`) and
tests/monitoring (the monitoring host's reader); the role's use of it: tests/roles."""

from __future__ import annotations

import json
import tarfile

import pytest

from infra import config, inventory, monitoring, nodeboot
from infra.bootstrap import NODE_PATHS
from infra.offline import offline_pem
from infra.plan import load_stack_config

PROD = ["aws-prod", "alicloud-prod"]
CA = "tls:index/selfSignedCert:SelfSignedCert"
SIGNED = "tls:index/locallySignedCert:LocallySignedCert"
REQUEST = "tls:index/certRequest:CertRequest"


def _cfg(stack: str) -> config.StackConfig:
    return config.load(config.raw_from_pulumi_config(load_stack_config(stack)), stack)


def _one(resources, name: str):
    (found,) = [r for r in resources if r.name == name]
    return found


def _documents(run) -> dict[str, dict]:
    """Each journal secret's document by the secret's name (and that it is a Pulumi secret)."""
    docs = {}
    if run.stack.startswith("aws"):
        for secret in run.of_type("aws:secretsmanager/secret:Secret"):
            if "journal" not in secret.inputs["name"]:
                continue
            (version,) = [
                v
                for v in run.of_type("aws:secretsmanager/secretVersion:SecretVersion")
                if v.inputs["secretId"] == f"{secret.name}-id"
            ]
            assert "secretString" in version.secrets, secret.name
            docs[secret.inputs["name"]] = json.loads(version.inputs["secretString"])
    else:
        for secret in run.of_type("alicloud:kms/secret:Secret"):
            if "journal" in secret.inputs["secretName"]:
                assert "secretData" in secret.secrets, secret.name
                docs[secret.inputs["secretName"]] = json.loads(secret.inputs["secretData"])
    return docs


@pytest.mark.parametrize("stack", PROD)
def test_the_journal_ca_signs_the_receivers_and_the_nodes_certificates(runs, stack):
    run, cfg = runs[stack], _cfg(stack)
    ca = _one(run.of_type(CA), "fleet-journal-ca")
    assert ca.inputs["isCaCertificate"] is True
    assert sorted(ca.inputs["allowedUses"]) == ["cert_signing", "crl_signing"]
    receiver = _one(run.of_type(SIGNED), "fleet-journal-receiver")
    node = _one(run.of_type(SIGNED), "fleet-journal-node")
    for cert in (receiver, node):
        assert cert.inputs["caCertPem"] == offline_pem("CERTIFICATE", ca.name)
        assert cert.inputs["caPrivateKeyPem"] == offline_pem("PRIVATE KEY", "fleet-journal-ca-key")
        assert "cert_signing" not in cert.inputs["allowedUses"]
    assert "server_auth" in receiver.inputs["allowedUses"]
    assert "client_auth" not in receiver.inputs["allowedUses"]
    assert "client_auth" in node.inputs["allowedUses"]
    assert "server_auth" not in node.inputs["allowedUses"]
    # what every upload checks the receiver against: the host's fixed address and its name
    request = _one(run.of_type(REQUEST), "fleet-journal-receiver")
    assert request.inputs["ipAddresses"] == [monitoring.address(cfg)] == ["10.42.240.10"]
    assert request.inputs["dnsNames"] == [monitoring.host_name(cfg)]
    assert "ipAddresses" not in _one(run.of_type(REQUEST), "fleet-journal-node").inputs


@pytest.mark.parametrize("stack", PROD)
def test_each_end_gets_its_own_certificate_key_and_the_ca_in_its_own_secret(runs, stack):
    run, cfg = runs[stack], _cfg(stack)
    docs = _documents(run)
    names = {end: monitoring.journal_secret_name(cfg, end) for end in monitoring.JOURNAL_ENDS}
    assert sorted(docs) == sorted(names.values())
    ca = offline_pem("CERTIFICATE", "fleet-journal-ca")
    for end, name in names.items():
        assert docs[name] == {
            "certificate": offline_pem("CERTIFICATE", f"fleet-journal-{end}"),
            "private_key": offline_pem("PRIVATE KEY", f"fleet-journal-{end}-key"),
            "ca": ca,
        }, end


def test_aws_each_secret_is_read_by_its_ends_role_alone(runs):
    run = runs["aws-prod"]
    readers: dict[str, list[str]] = {}
    for secret in run.of_type("aws:secretsmanager/secret:Secret"):
        arn = f"arn:aws:secretsmanager:::{secret.name}-id"
        for policy in run.of_type("aws:iam/rolePolicy:RolePolicy"):
            if arn not in policy.inputs["policy"]:
                continue
            (statement,) = json.loads(policy.inputs["policy"])["Statement"]
            assert statement["Action"] == ["secretsmanager:GetSecretValue"]
            assert statement["Resource"] == [arn]
            readers.setdefault(secret.inputs["name"], []).append(policy.inputs["role"])
    assert readers["torchfleet/aws-prod/journal-node"] == ["fleet-node-role-id"]
    assert readers["torchfleet/aws-prod/journal-receiver"] == ["monitoring-role-id"]


def test_alicloud_each_secret_is_read_by_its_ends_role_alone(runs):
    run = runs["alicloud-prod"]
    roles = {
        a.inputs["policyName"]: a.inputs["roleName"]
        for a in run.of_type("alicloud:ram/rolePolicyAttachment:RolePolicyAttachment")
    }
    readers: dict[str, list[str]] = {}
    for policy in run.of_type("alicloud:ram/policy:Policy"):
        for statement in json.loads(policy.inputs["policyDocument"])["Statement"]:
            for resource in statement["Resource"]:
                if ":secret/" in resource and "journal" in resource:
                    assert statement["Action"] == ["kms:GetSecretValue"]
                    secret = resource.rsplit("/", 1)[1]
                    readers.setdefault(secret, []).append(roles[policy.inputs["policyName"]])
    node_role = _one(run.of_type("alicloud:ram/role:Role"), "fleet-node-role").inputs["roleName"]
    assert readers == {
        "torchfleet-alicloud-prod-journal-node": [node_role],
        "torchfleet-alicloud-prod-journal-receiver": ["torchfleet-alicloud-prod-monitoring"],
    }


@pytest.mark.parametrize("stack", PROD)
def test_the_inventory_and_the_bundle_tell_each_end_where_to_read(runs, stack):
    run, cfg = runs[stack], _cfg(stack)
    children = run.outputs["inventory"]["all"]["children"]
    node_vars = children[inventory.GROUP]["vars"]
    assert node_vars["monitoring_logs_tls_command"] == [
        NODE_PATHS["command"],
        "journal-tls",
        monitoring.journal_secret_name(cfg, "node"),
    ]
    (host,) = children[inventory.MONITORING_GROUP]["hosts"].values()
    assert host["monitoring_logs_tls_secret"] == monitoring.journal_secret_name(cfg, "receiver")
    assert host["monitoring_logs_tls_region"] == cfg.region
    assert "monitoring_logs_tls_command" not in host  # the role reads it with its own reader
    for end in (node_vars, host):
        assert {k: end[k] for k in inventory.JOURNAL_TLS_FILES} == inventory.JOURNAL_TLS_FILES
    assert len(set(inventory.JOURNAL_TLS_FILES.values())) == 3
    # a node that configures itself reads the same variables from its bundle
    with tarfile.open(nodeboot.stack_bundle(cfg).path) as tar:
        facts = json.load(tar.extractfile("node.json"))
    for key in ("monitoring_logs_tls_command", *inventory.JOURNAL_TLS_FILES):
        assert facts["group_vars"][key] == node_vars[key], key
    # no key, no certificate travels in the inventory or the bundle: only the secrets' names
    text = json.dumps(run.outputs["inventory"]) + json.dumps(facts)
    assert "PRIVATE KEY" not in text and "offline fleet-journal" not in text


@pytest.mark.parametrize("stack", PROD)
def test_the_plan_says_where_each_end_reads_its_certificate(runs, stack):
    from infra.plan import monitoring_lines

    cfg = _cfg(stack)
    (line,) = [x for x in monitoring_lines(runs[stack]) if x.startswith("journal over HTTPS")]
    assert f"for {monitoring.address(cfg)}, {monitoring.host_name(cfg)} " in line
    receiver = monitoring.journal_secret_name(cfg, "receiver")
    node = monitoring.journal_secret_name(cfg, "node")
    assert f"(secret {receiver}, read by the monitoring host alone)" in line
    assert f"(secret {node}, read by the nodes alone)" in line
