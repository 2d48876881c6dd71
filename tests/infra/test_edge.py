"""The production edge over every example stack under the mock engine: HTTPS at every load
balancer with a TLS 1.2+ policy and HTTP only redirecting; the API token a secret output, kept
in the cloud's secret store, readable by the node role, in no user-data and no bundle file. And
the `tls` / `api_token` keys' refusals. Each policy counts what it checked and fails when it
checked nothing. (The roles' scope, the token's grant included: test_policy.py.)"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from urllib.parse import urlsplit

import pytest

from infra import config, edge, nodeboot
from infra.offline import offline_token, run_offline
from infra.plan import ALL_STACKS

TOKEN = offline_token("api-token")  # what the mock engine's pulumi_random generates
STRONG = set(edge.POLICIES["aws"].values()) | set(edge.POLICIES["alicloud"].values())


def test_every_load_balancer_serves_https_and_http_only_redirects(every):
    balanced = 0
    for stack in ALL_STACKS:
        run, https, http = every[stack], 0, 0
        for li in run.of_type("aws:lb/listener:Listener"):
            if li.inputs["protocol"] == "HTTPS":
                assert li.inputs["sslPolicy"] in edge.POLICIES["aws"].values(), li.inputs
                assert li.inputs["certificateArn"].startswith("arn:aws:acm:")
                assert li.inputs["port"] == 443
                https += 1
            else:
                (action,) = li.inputs["defaultActions"]
                assert action["type"] == "redirect", (stack, li.inputs)
                redirect = action["redirect"]
                assert (redirect["protocol"], redirect["statusCode"]) == ("HTTPS", "HTTP_301")
                http += 1
        for li in run.of_type("alicloud:slb/listener:Listener"):
            if li.inputs["protocol"] == "https":
                assert li.inputs["tlsCipherPolicy"] in edge.POLICIES["alicloud"].values()
                assert li.inputs["serverCertificateId"] and li.inputs["frontendPort"] == 443
                https += 1
            else:
                assert li.inputs["listenerForward"] == "on" and li.inputs["forwardPort"] == 443
                assert "healthCheck" not in li.inputs  # it forwards nothing to a backend
                http += 1
        for svc in run.of_type("kubernetes:core/v1:Service"):
            notes = svc.inputs["metadata"]["annotations"]
            ports = {p["name"]: p["port"] for p in svc.inputs["spec"]["ports"]}
            assert ports.get("https") == 443, (stack, ports)
            prefix = "service.beta.kubernetes.io/"
            if stack.startswith("aws"):
                assert ports == {"https": 443}  # an NLB cannot redirect: no HTTP at all
                assert notes[prefix + "aws-load-balancer-ssl-ports"] == "https"
                assert notes[prefix + "aws-load-balancer-ssl-negotiation-policy"] in STRONG
                assert notes[prefix + "aws-load-balancer-ssl-cert"].startswith("arn:aws:acm:")
            else:
                ali = prefix + "alibaba-cloud-loadbalancer-"
                assert notes[ali + "tls-cipher-policy"] in STRONG and notes[ali + "cert-id"]
                if "http" in ports:
                    assert notes[ali + "forward-port"] == "80:443"
            https += 1
        if (
            run.of_type("aws:lb/loadBalancer:LoadBalancer")
            or run.of_type("kubernetes:core/v1:Service")
            or run.of_type("alicloud:slb/applicationLoadBalancer:ApplicationLoadBalancer")
        ):
            assert https >= 1, f"{stack}: a load balancer without an HTTPS listener"
            balanced += 1
    assert balanced == 4  # aws-prod, alicloud-prod, aws-k8s, alicloud-k8s


def _user_data(run) -> list[str]:
    found = []
    for kind, key in (
        ("aws:ec2/launchTemplate:LaunchTemplate", "userData"),
        ("aws:ec2/instance:Instance", "userDataBase64"),
        ("alicloud:ecs/instance:Instance", "userData"),
        ("alicloud:ess/scalingConfiguration:ScalingConfiguration", "userData"),
    ):
        for r in run.of_type(kind):
            if r.inputs.get(key):
                found.append(base64.b64decode(r.inputs[key]).decode())
    return found


def _bundle_files(stack: str, values: dict) -> dict[str, bytes]:
    cfg = config.load(config.raw_from_pulumi_config(values), stack)
    bundle = nodeboot.stack_bundle(cfg)
    with tarfile.open(fileobj=io.BytesIO(bundle.path.read_bytes())) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _node_reader(run, stack: str) -> int:
    """Checks that the node role may read the token's secret; returns how many grants."""
    if stack in ("aws-k8s", "alicloud-k8s"):
        (secret,) = run.of_type("kubernetes:core/v1:Secret")
        assert TOKEN in secret.inputs["stringData"]["api-tokens"]
        assert "stringData" in secret.secrets
        (deployment,) = run.of_type("kubernetes:apps/v1:Deployment")
        pod = deployment.inputs["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == secret.inputs["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["TORCHFLEET_API_TOKEN_FILE"].endswith("/api-tokens")
        return 1
    if stack.startswith("aws"):
        # the tokens' secret (aws-prod also has the nodes' certificate's: test_backend_tls.py)
        (version,) = [
            v
            for v in run.of_type("aws:secretsmanager/secretVersion:SecretVersion")
            if v.name.endswith("-api-token")
        ]
        assert version.inputs["secretString"].splitlines()[0] == TOKEN
        assert "secretString" in version.secrets
        (secret,) = [
            s
            for s in run.of_type("aws:secretsmanager/secret:Secret")
            if s.inputs["name"] == edge.secret_name(_cfg(stack))
        ]
        arn = f"arn:aws:secretsmanager:::{secret.name}-id"
        grants = [
            p
            for p in run.of_type("aws:iam/rolePolicy:RolePolicy")
            if "secretsmanager:GetSecretValue" in p.inputs["policy"] and arn in p.inputs["policy"]
        ]
        for grant in grants:
            (statement,) = json.loads(grant.inputs["policy"])["Statement"]
            assert statement["Resource"] == [arn] and grant.inputs["role"].endswith("node-role-id")
        return len(grants)
    name = edge.secret_name(_cfg(stack))
    (secret,) = [
        s for s in run.of_type("alicloud:kms/secret:Secret") if s.inputs["secretName"] == name
    ]
    assert secret.inputs["secretData"].splitlines()[0] == TOKEN and "secretData" in secret.secrets
    policies = [
        p
        for p in run.of_type("alicloud:ram/policy:Policy")
        if "kms:GetSecretValue" in p.inputs["policyDocument"]
        and f"secret/{name}" in p.inputs["policyDocument"]
    ]
    attached = {
        a.inputs["policyName"]: a.inputs["roleName"]
        for a in run.of_type("alicloud:ram/rolePolicyAttachment:RolePolicyAttachment")
    }
    for policy in policies:
        (statement,) = json.loads(policy.inputs["policyDocument"])["Statement"]
        assert statement["Resource"] == [f"acs:kms:{_cfg(stack).region}:*:secret/{name}"]
        assert attached[policy.inputs["policyName"]].endswith("-node")
    return len(policies)


def test_the_token_is_a_secret_output_the_node_role_reads_and_nothing_else_carries(every):
    checked = 0
    for stack in ALL_STACKS:
        run = every[stack]
        assert "api_token" in run.secret_outputs and run.outputs["api_token"] == TOKEN
        assert _node_reader(run, stack) == 1
        for text in _user_data(run):
            assert TOKEN not in text
            assert json.dumps(edge.secret_name(_cfg(stack))) in text  # the name, not the value
            checked += 1
    assert checked >= 4


def _cfg(stack: str) -> config.StackConfig:
    from infra.plan import load_stack_config

    return config.load(config.raw_from_pulumi_config(load_stack_config(stack)), stack)


@pytest.mark.parametrize("stack", ["aws-dev", "alicloud-prod"])
def test_a_given_token_stays_out_of_user_data_and_the_bundle(with_overrides, stack):
    given, following = "given-token-0123456789abcdef", "next-token-0123456789abcdef"
    values = with_overrides(stack, api_token=given, api_token_next=following)
    run = run_offline(stack, values)
    assert run.outputs["api_token"] == given and "api_token" in run.secret_outputs
    assert not run.of_type("random:index/randomPassword:RandomPassword")
    stored = [
        r.inputs.get("secretString") or r.inputs.get("secretData")
        for r in run.custom()
        if r.type
        in ("aws:secretsmanager/secretVersion:SecretVersion", "alicloud:kms/secret:Secret")
        and "journal" not in r.name  # the journal's certificates (test_journal_tls.py)
    ]
    assert stored == [f"{given}\n{following}\n"]  # the nodes accept both during the rotation
    texts = _user_data(run)
    assert texts and not [t for t in texts if given in t or following in t]
    files = _bundle_files(stack, values)
    assert "node.json" in files and len(files) > 10
    leaked = [
        n for n, data in files.items() if given.encode() in data or following.encode() in data
    ]
    assert leaked == []


# --- the keys --------------------------------------------------------------------------------


def _problems(with_overrides, stack: str, **overrides) -> str:
    values = with_overrides(stack, **overrides)
    with pytest.raises(config.ConfigError) as err:
        config.load(config.raw_from_pulumi_config(values), stack)
    return str(err.value)


def test_a_public_prod_stack_without_tls_is_refused_before_any_resource(with_overrides):
    from infra.offline import OfflineMocks, RecordingMonitor

    for stack in ("aws-prod", "alicloud-prod", "alicloud-k8s"):
        err = _problems(with_overrides, stack, tls=None)
        assert "torchfleet:tls = None is invalid" in err and "client_cidrs" in err
    monitor = RecordingMonitor(OfflineMocks())
    with pytest.raises(Exception, match="torchfleet:tls"):
        run_offline("aws-prod", with_overrides("aws-prod", tls=None), monitor)
    assert [r for r in monitor.registrations if r[4] and not r[1].startswith("pulumi:")] == []
    # an internal prod load balancer (no client_cidrs) may stay on HTTP inside the VPC
    values = with_overrides("aws-prod", tls=None, client_cidrs=None)
    assert config.load(config.raw_from_pulumi_config(values), "aws-prod").tls is None


def test_a_public_dev_group_without_tls_is_refused_too(with_overrides, settings):
    """The environment does not matter: a dev group whose load balancer clients outside the
    VPC reach carries the same bearer token, so it serves HTTPS only as well."""
    dev = with_overrides(
        "aws-dev",
        mode="group",
        client_cidrs=["198.51.100.0/24"],
        scaling=settings("aws-prod")["scaling"],
    )
    with pytest.raises(config.ConfigError) as err:
        config.load(config.raw_from_pulumi_config(dev), "aws-dev")
    assert "torchfleet:tls = None is invalid" in str(err.value) and "(dev too)" in str(err.value)
    assert len(err.value.problems) == 1, err.value  # nothing else is wrong with it
    dev.pop("torchfleet:client_cidrs")  # inside the VPC only: plain HTTP may stay
    assert config.load(config.raw_from_pulumi_config(dev), "aws-dev").tls is None


def test_tls_values_are_checked(with_overrides):
    wrong_region = (
        "arn:aws:acm:eu-west-1:123456789012:certificate/00000000-0000-4000-8000-000000000000"
    )
    err = _problems(
        with_overrides, "aws-prod", tls={"certificate": wrong_region, "min_version": "1.1"}
    )
    assert f"torchfleet:tls.certificate = {wrong_region!r} is invalid" in err
    assert "stack's region us-east-1" in err
    assert "torchfleet:tls.min_version = '1.1' is invalid; allowed: 1.2 | 1.3" in err
    err = _problems(
        with_overrides, "alicloud-prod", tls={"certificate": "1234_cert", "min_version": "1.3"}
    )
    assert "torchfleet:tls.min_version = '1.3' is invalid; allowed: 1.2 on alicloud" in err
    err = _problems(with_overrides, "aws-dev", tls={"certificate": "x"})
    assert "torchfleet:tls = " in err and "unset in mode: instances" in err


def test_a_bad_token_is_refused_without_showing_it(with_overrides):
    err = _problems(with_overrides, "aws-dev", api_token="short secret", api_token_next="x" * 20)
    assert "torchfleet:api_token = '(secret)' is invalid" in err and "short secret" not in err
    err = _problems(with_overrides, "aws-dev", api_token="t" * 20, api_token_next="t" * 20)
    assert "torchfleet:api_token_next = '(secret)' is invalid; allowed: a token other than" in err


@pytest.mark.parametrize("stack", ["aws-dev", "alicloud-dev"])
def test_whoever_converges_a_node_keeps_auth_on(runs, with_overrides, stack):
    """The operator's play (the stack's inventory) and the node's own (the bundle's node.json)
    both read the token on the node with its role: neither writes a runtime config without it."""
    from infra.bootstrap import NODE_PATHS

    command = [NODE_PATHS["command"], "api-token"]
    hosts = runs[stack].outputs["inventory"]["all"]["children"]["gpu_nodes"]["hosts"]
    assert hosts and all(
        h["inference_runtime_api_token_command"] == command for h in hosts.values()
    )
    node = json.loads(_bundle_files(stack, with_overrides(stack))["node.json"])
    assert node["group_vars"]["inference_runtime_api_token_command"] == command


# --- every environment, every mode ----------------------------------------------------------


@pytest.mark.parametrize("stack", ALL_STACKS)
@pytest.mark.parametrize("env", ["dev", "prod"])
def test_no_endpoint_leaves_the_vpc_in_the_clear(with_overrides, settings, stack, env):
    """Each example stack, as dev and as prod, with clients outside the VPC and no `tls`: a load
    balancer (group) or a Service's (kubernetes) is refused without HTTPS; a node of mode
    instances admits its service port from the VPC alone, so `client_cidrs` is refused there."""
    mode = settings(stack)["mode"]
    err = _problems(with_overrides, stack, env=env, tls=None, client_cidrs=["198.51.100.0/24"])
    if mode == "instances":
        assert "torchfleet:client_cidrs = ['198.51.100.0/24'] is invalid" in err, err
        assert "unset in mode: instances" in err
    else:
        assert "torchfleet:tls = None is invalid" in err and "client_cidrs" in err, err


# --- a certificate the stack generates (dev) -------------------------------------------------

GENERATE = {"certificate": "generate"}


def _public_dev_group(with_overrides, settings, stack: str) -> dict:
    prod = stack.replace("-dev", "-prod")
    return with_overrides(
        stack,
        mode="group",
        nodes=settings(prod)["nodes"],
        client_cidrs=["198.51.100.0/24"],
        scaling=settings(prod)["scaling"],
        tls=GENERATE,
    )


def _one(run, type_: str):
    (found,) = run.of_type(type_)
    return found


@pytest.mark.parametrize("stack", ["aws-dev", "alicloud-dev"])
def test_a_dev_stack_generates_its_certificate_and_publishes_its_ca(
    with_overrides, settings, stack
):
    from infra.constants import CA_OUTPUT
    from infra.offline import offline_pem

    run = run_offline(stack, _public_dev_group(with_overrides, settings, stack))
    keys = {k.name: k for k in run.of_type("tls:index/privateKey:PrivateKey")}
    ca = _one(run, "tls:index/selfSignedCert:SelfSignedCert")
    csr = _one(run, "tls:index/certRequest:CertRequest")
    cert = _one(run, "tls:index/locallySignedCert:LocallySignedCert")
    ca_pem = offline_pem("CERTIFICATE", ca.name)
    cert_pem = offline_pem("CERTIFICATE", cert.name)
    ca_key, cert_key = (keys[n] for n in sorted(keys))  # "<name>-ca-key" < "<name>-endpoint-key"
    assert ca_key.name.endswith("-ca-key") and cert_key.name.endswith("-endpoint-key")
    # the CA: self-signed, may sign certificates and nothing else
    assert ca.inputs["isCaCertificate"] is True
    assert sorted(ca.inputs["allowedUses"]) == ["cert_signing", "crl_signing"]
    assert ca.inputs["privateKeyPem"] == offline_pem("PRIVATE KEY", ca_key.name)
    # the endpoint's certificate: its own key, signed by that CA, for serving only
    assert csr.inputs["privateKeyPem"] == offline_pem("PRIVATE KEY", cert_key.name)
    assert cert.inputs["caCertPem"] == ca_pem
    assert cert.inputs["caPrivateKeyPem"] == offline_pem("PRIVATE KEY", ca_key.name)
    assert "server_auth" in cert.inputs["allowedUses"]
    assert "cert_signing" not in cert.inputs["allowedUses"]
    assert 0 < cert.inputs["earlyRenewalHours"] < cert.inputs["validityPeriodHours"]
    # the CA is an output (what clients trust); no key is
    assert run.outputs[CA_OUTPUT] == ca_pem
    assert not any("PRIVATE KEY" in json.dumps(v) for v in run.outputs.values())
    host = urlsplit(run.outputs["endpoint"]).hostname
    assert run.outputs["endpoint"].startswith("https://") and host
    if stack.startswith("aws"):
        assert csr.inputs["dnsNames"] == [host]  # the ALB's DNS name
        imported = _one(run, "aws:acm/certificate:Certificate")
        assert imported.inputs["certificateBody"] == cert_pem
        assert imported.inputs["certificateChain"] == ca_pem
        assert imported.inputs["privateKey"] == offline_pem("PRIVATE KEY", cert_key.name)
        assert "privateKey" in imported.secrets
        (https,) = [
            li for li in run.of_type("aws:lb/listener:Listener") if li.inputs["protocol"] == "HTTPS"
        ]
        assert https.inputs["certificateArn"] == f"arn:aws:acm:::{imported.name}-id"
        assert https.inputs["sslPolicy"] in edge.POLICIES["aws"].values()
    else:
        assert csr.inputs["ipAddresses"] == [host]  # the CLB's address
        uploaded = _one(run, "alicloud:slb/serverCertificate:ServerCertificate")
        assert uploaded.inputs["serverCertificate"] == cert_pem + ca_pem
        assert uploaded.inputs["privateKey"] == offline_pem("PRIVATE KEY", cert_key.name)
        assert "privateKey" in uploaded.secrets
        (https,) = [
            li
            for li in run.of_type("alicloud:slb/listener:Listener")
            if li.inputs["protocol"] == "https"
        ]
        assert https.inputs["serverCertificateId"] == f"{uploaded.name}-id"


def test_a_given_certificate_generates_nothing(every):
    """The six example stacks name their certificates (or have none): no CA, no import. (The
    nodes' certificate of tls.backend is another thing: test_backend_tls.py; so is the journal's
    CA of a stack with monitoring: test_journal_tls.py.)"""
    for stack, run in every.items():
        made = [r for r in run.resources if r.type.startswith("tls:")]
        assert [
            r.name
            for r in made
            if not r.name.endswith("-node-tls-key") and not r.name.startswith("fleet-journal")
        ] == (["fleet-node-tls"] if stack == "aws-prod" else []), stack
        assert run.of_type("aws:acm/certificate:Certificate") == [], stack
        assert run.of_type("alicloud:slb/serverCertificate:ServerCertificate") == [], stack


def test_generate_is_refused_in_prod_and_in_kubernetes_mode(with_overrides):
    for stack in ("aws-prod", "alicloud-prod"):
        err = _problems(with_overrides, stack, tls=GENERATE)
        assert "torchfleet:tls.certificate = 'generate' is invalid" in err, err
        assert "a prod endpoint's clients must trust it" in err
        assert "generate is for dev stacks" in err
    err = _problems(with_overrides, "aws-k8s", tls=GENERATE)
    assert "torchfleet:tls.certificate = 'generate' is invalid" in err, err
    assert "generate is for mode: group" in err


def test_every_grant_to_read_a_secret_waits_for_its_value(runs):
    """A node boots once its grants exist (aws/fleet.py): each grant to read a secret depends on
    the secret's stored value (its SecretVersion), not only on the secret, so no node reads an
    empty one. Over aws-prod: the tokens, the nodes' certificate and both journal ends."""
    run = runs["aws-prod"]
    # a version's URN -> its secret's id
    versions = {
        v.urn: v.inputs["secretId"]
        for v in run.of_type("aws:secretsmanager/secretVersion:SecretVersion")
    }
    checked = 0
    for policy in run.of_type("aws:iam/rolePolicy:RolePolicy"):
        if "secretsmanager:GetSecretValue" not in policy.inputs["policy"]:
            continue
        (statement,) = json.loads(policy.inputs["policy"])["Statement"]
        (arn,) = statement["Resource"]
        waited = [versions[d] for d in policy.dependencies if d in versions]
        assert [arn.replace("arn:aws:secretsmanager:::", "")] == waited, policy.name
        checked += 1
    assert checked == 4, checked
