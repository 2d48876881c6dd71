"""The optional monitoring host (`monitoring.enabled`; the prod examples set it) under the mock
engine: what its security groups admit, how it is hardened, the inventory and bundle entries
that let every node reach it, its cost, and the config's errors.

Every test fails when it finds nothing to check: exact sets, one-element unpacking, counts.
Security groups are read from every ingress rule (inline or standalone), each source listed on
its own, so a rule cannot hide a CIDR behind a group."""

from __future__ import annotations

import json
import os
import tarfile

import pytest

from infra.config import ConfigError, load
from infra.offline import run_offline

PROD = ("aws-prod", "alicloud-prod")
NODE_EXPORTER, JOURNAL = 9100, 19532  # roles/monitoring defaults, spelled out on purpose
SG = {
    "aws": "aws:ec2/securityGroup:SecurityGroup",
    "alicloud": "alicloud:ecs/securityGroup:SecurityGroup",
}
HOST = {"aws": "aws:ec2/instance:Instance", "alicloud": "alicloud:ecs/instance:Instance"}
AWS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
ALI_RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"


def _groups(run) -> dict[str, str]:
    """security group id (as the mocks hand it back) -> its role: nodes | monitoring | lb."""
    cloud = run.stack.split("-")[0]
    return {f"{sg.name}-id": sg.name.rsplit("-", 1)[1] for sg in run.of_type(SG[cloud])}


def _ingress(run) -> list[tuple[str, str, int, str]]:
    """Every ingress rule of the stack as (target group, protocol, port, source): a source is a
    group role (nodes, monitoring, lb) or a CIDR. Port ranges are expanded only where narrow."""
    groups, out = _groups(run), []

    def ports(lo: int, hi: int) -> range:
        assert hi - lo < 16, f"a wide port range {lo}-{hi}"
        return range(lo, hi + 1)

    for sg in run.of_type(SG["aws"]):
        for rule in sg.inputs.get("ingress", []):
            sources = (
                [groups[g] for g in rule.get("securityGroups", [])]
                + rule.get("cidrBlocks", [])
                + rule.get("ipv6CidrBlocks", [])
                + rule.get("prefixListIds", [])
                + ([sg.name.rsplit("-", 1)[1]] if rule.get("self") else [])
            )
            assert sources, f"a rule with no source: {rule}"
            out += [
                (sg.name.rsplit("-", 1)[1], rule["protocol"], p, src)
                for p in ports(int(rule["fromPort"]), int(rule["toPort"]))
                for src in sources
            ]
    for r in run.of_type(AWS_RULE):
        i = r.inputs
        out += [
            (groups[i["securityGroupId"]], i["ipProtocol"], p, src)
            for p in ports(int(i["fromPort"]), int(i["toPort"]))
            for src in _sources(
                groups, i, "referencedSecurityGroupId", "cidrIpv4", "cidrIpv6", "prefixListId"
            )
        ]
    for r in run.of_type(ALI_RULE):
        i = r.inputs
        if i["type"] != "ingress":
            continue
        lo, hi = (int(p) for p in i["portRange"].split("/"))
        out += [
            (groups[i["securityGroupId"]], i["ipProtocol"], p, src)
            for p in ports(lo, hi)
            for src in _sources(
                groups, i, "sourceSecurityGroupId", "cidrIp", "ipv6CidrIp", "prefixListId"
            )
        ]
    return out


def _sources(groups: dict[str, str], rule: dict, group_key: str, *other_keys: str) -> list[str]:
    """Every source a standalone rule names (a rule naming a group and a CIDR admits both, or
    on Alibaba the CIDR alone): none may hide behind another."""
    found = [groups[rule[group_key]]] if rule.get(group_key) else []
    found += [rule[k] for k in other_keys if rule.get(k)]
    assert found, f"a rule with no source: {rule}"
    return found


@pytest.mark.parametrize("stack", PROD)
def test_scrape_ports_admitted_only_from_the_monitoring_group(runs, settings, stack):
    run, cfg = runs[stack], settings(stack)
    rules = _ingress(run)
    service = cfg["service_port"]
    checked = 0
    for target, _, port, source in rules:
        if target == "nodes" and port == NODE_EXPORTER:
            assert source == "monitoring", (target, port, source)
            checked += 1
        if target == "nodes" and port == service:
            # the scraper, and the load balancer as before (AWS: its group; Alibaba: the VPC
            # and the CLB's source range, unchanged by monitoring)
            allowed = (
                {"monitoring", "lb"}
                if stack.startswith("aws")
                else {"monitoring", "10.42.0.0/16", "100.64.0.0/10"}
            )
            assert source in allowed, (target, port, source)
            checked += 1
    assert ("nodes", "tcp", NODE_EXPORTER, "monitoring") in rules
    assert ("nodes", "tcp", service, "monitoring") in rules
    assert checked >= 3, checked


@pytest.mark.parametrize("stack", PROD)
def test_monitoring_group_admits_only_what_is_listed(runs, settings, stack):
    run, cfg = runs[stack], settings(stack)
    admitted = {
        (proto, port, src) for target, proto, port, src in _ingress(run) if target == "monitoring"
    }
    assert admitted == {
        ("tcp", JOURNAL, "nodes"),
        *(("tcp", 22, cidr) for cidr in cfg["admin_cidrs"]),
    }, admitted
    if stack.startswith("aws"):
        # no inline rules beside the standalone ones (the provider would fight over them)
        (sg,) = [sg for sg in run.of_type(SG["aws"]) if sg.name.endswith("-monitoring")]
        assert "ingress" not in sg.inputs
    # the load balancer may reach what it reached without monitoring: the service port only
    for sg in run.of_type(SG["aws"]):
        if sg.name.endswith("-lb"):
            assert [(int(e["fromPort"]), int(e["toPort"])) for e in sg.inputs["egress"]] == [
                (cfg["service_port"], cfg["service_port"])
            ]


@pytest.mark.parametrize("stack", PROD)
def test_monitoring_host_is_private_encrypted_and_imdsv2(runs, stack):
    run = runs[stack]
    cloud = stack.split("-")[0]
    (host,) = run.tagged(HOST[cloud], "monitoring")
    i = host.inputs
    assert i["privateIp"] == "10.42.240.10"  # the address plan's services block, host .10
    if cloud == "aws":
        assert i["associatePublicIpAddress"] is False
        assert i["metadataOptions"]["httpTokens"] == "required"
        assert i["rootBlockDevice"]["encrypted"] is True
        (subnet,) = [
            s for s in run.of_type("aws:ec2/subnet:Subnet") if i["subnetId"] == f"{s.name}-id"
        ]
        assert subnet.inputs["mapPublicIpOnLaunch"] is False
        assert subnet.inputs["cidrBlock"] == "10.42.240.0/20"
        (assoc,) = [
            a
            for a in run.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
            if a.inputs["subnetId"] == i["subnetId"]
        ]
        (table,) = [
            t
            for t in run.of_type("aws:ec2/routeTable:RouteTable")
            if assoc.inputs["routeTableId"] == f"{t.name}-id"
        ]
        assert [r.get("natGatewayId") for r in table.inputs["routes"]] != [None]
        assert not [r for r in table.inputs["routes"] if r.get("gatewayId")]  # no IGW route
    else:
        assert i["internetMaxBandwidthOut"] == 0
        assert i["httpTokens"] == "required" and i["systemDiskEncrypted"] is True
        # the role's ECS discovery lists a group stack's nodes; beside it, BSS's instance bill
        assert i["roleName"] == f"torchfleet-{stack}-monitoring"  # the role's default
        attached = {
            a.inputs["policyName"]
            for a in run.of_type("alicloud:ram/rolePolicyAttachment:RolePolicyAttachment")
            if a.inputs["roleName"] == i["roleName"]
        }
        statements = {
            p.inputs["policyName"]: json.loads(p.inputs["policyDocument"])["Statement"]
            for p in run.of_type("alicloud:ram/policy:Policy")
            if p.inputs["policyName"] in attached
        }
        assert statements == {
            f"torchfleet-{stack}-monitoring-spend": [
                {
                    "Effect": "Allow",
                    "Action": ["bssapi:DescribeInstanceBill", "ecs:DescribeInstances"],
                    "Resource": ["*"],
                }
            ],
            # the journal receiver's certificate secret, that one alone
            f"torchfleet-{stack}-monitoring-journal": [
                {
                    "Effect": "Allow",
                    "Action": ["kms:GetSecretValue"],
                    "Resource": [
                        f"acs:kms:cn-shanghai:*:secret/torchfleet-{stack}-journal-receiver"
                    ],
                }
            ],
        }
        (ram_role,) = [
            r
            for r in run.of_type("alicloud:ram/role:Role")
            if r.inputs["roleName"] == i["roleName"]
        ]
        assert "ecs.aliyuncs.com" in ram_role.inputs["assumeRolePolicyDocument"]
        (snat,) = run.of_type("alicloud:vpc/snatEntry:SnatEntry")
        assert snat.inputs["sourceVswitchId"] == i["vswitchId"]  # SNAT for its vSwitch only


def test_monitoring_role_may_only_describe_read_the_bill_and_its_journal_certificate(runs):
    run = runs["aws-prod"]
    (host,) = run.tagged(HOST["aws"], "monitoring")
    (profile,) = [
        p
        for p in run.of_type("aws:iam/instanceProfile:InstanceProfile")
        if host.inputs["iamInstanceProfile"] == f"{p.name}-name"
    ]
    role = profile.inputs["role"].removesuffix("-name")
    policies = [
        p for p in run.of_type("aws:iam/rolePolicy:RolePolicy") if p.inputs["role"] == f"{role}-id"
    ]
    statements = [s for p in policies for s in json.loads(p.inputs["policy"])["Statement"]]
    # the journal receiver's certificate: its one secret, nothing else of Secrets Manager
    (journal,) = [s for s in statements if s["Resource"] != "*"]
    (secret,) = [
        s
        for s in run.of_type("aws:secretsmanager/secret:Secret")
        if s.inputs["name"] == "torchfleet/aws-prod/journal-receiver"
    ]
    assert journal == {
        "Sid": "ReadTheJournalCertificate",
        "Effect": "Allow",
        "Action": ["secretsmanager:GetSecretValue"],
        "Resource": [f"arn:aws:secretsmanager:::{secret.name}-id"],
    }
    statements.remove(journal)
    assert all(s["Effect"] == "Allow" and s["Resource"] == "*" for s in statements)
    assert "Condition" not in str(statements)
    # Prometheus' EC2 discovery, and the spend exporter's read of Cost Explorer
    assert sorted(sorted(s["Action"]) for s in statements) == [
        ["ce:GetCostAndUsage"],
        ["ec2:DescribeAvailabilityZones", "ec2:DescribeInstances"],
    ]
    assert not [
        a
        for a in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.inputs["role"] == f"{role}-name"
    ]


@pytest.mark.parametrize("stack", PROD)
def test_inventory_and_bundle_name_the_monitoring_host(runs, stack):
    from infra import bundle, config, nodeboot
    from infra.plan import load_stack_config

    run = runs[stack]
    children = run.outputs["inventory"]["all"]["children"]
    ((name, host),) = children["monitoring"]["hosts"].items()
    assert name == f"{stack}-monitoring"
    assert host["ansible_host"] == host["private_ip"] == "10.42.240.10"
    assert host["ansible_user"] == ("admin" if stack.startswith("aws") else "root")  # Debian 12
    # group mode: every node gets the receiver from the group vars (and so from the bundle)
    assert children["gpu_nodes"]["vars"]["monitoring_logs_server"] == host["private_ip"]
    cfg = config.load(config.raw_from_pulumi_config(load_stack_config(stack)), stack)
    made = nodeboot.stack_bundle(cfg)
    assert made.sha256 == run.outputs["bundle_sha256"]
    with tarfile.open(made.path) as tar:
        facts = json.load(tar.extractfile("node.json"))
    assert facts["group_vars"]["monitoring_logs_server"] == host["private_ip"]
    assert bundle.build(stack, config=cfg).sha256 == made.sha256  # reproducible


@pytest.mark.parametrize("stack", PROD)
def test_ansible_sees_the_monitoring_host_from_the_stack_output(runs, settings, tmp_path, stack):
    """The stack's inventory output, written as `torchfleet up` writes it (stack.yml beside the
    committed hosts.yml and group_vars), read by real `ansible-inventory`: the committed, empty
    `monitoring` group gains the host, and the nodes' group carries the receiver. The cloud
    discovery sources are left out (they need the cloud API; tests/inventory runs them)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from infra.deploy.inventory import write
    from infra.matrix import REPO_ROOT

    inv_dir = tmp_path / "inventories" / stack
    inv_dir.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "inventories" / stack / "hosts.yml", inv_dir)
    shutil.copytree(REPO_ROOT / "inventories" / stack / "group_vars", inv_dir / "group_vars")
    write(stack, runs[stack].outputs["inventory"], tmp_path / "inventories")
    (inv_dir / "group_nodes.py").unlink(missing_ok=True)  # lists a cloud's nodes
    listed = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-inventory"),
            "-i",
            str(inv_dir),
            "--list",
            "--export",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true"},
    )
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert found["monitoring"]["hosts"] == [f"{stack}-monitoring"]
    host = found["_meta"]["hostvars"][f"{stack}-monitoring"]
    assert host["ansible_host"] == host["private_ip"] == "10.42.240.10"
    assert host["monitoring_runtime_port"] == settings(stack)["service_port"]
    assert found["gpu_nodes"]["vars"]["monitoring_logs_server"] == host["private_ip"]


@pytest.mark.parametrize("stack", PROD)
def test_instances_mode_nodes_reach_the_monitoring_host(settings, with_overrides, stack):
    """A prod stack in instances mode (no TTL, so the host is allowed): each node's host vars
    name the receiver, its node exporter admits the monitoring group only, and the host is in
    the inventory beside the nodes."""
    spot = {**settings(stack)["spot"], "on_demand_base": 0}
    run = run_offline(
        stack,
        with_overrides(
            stack,
            mode="instances",
            spot=spot,
            scaling=None,
            client_cidrs=None,
            tls=None,
            extra_instance_types=None,
        ),
    )
    assert run.tagged(HOST[stack.split("-")[0]], "gpu-node")  # plain instances, not a group
    children = run.outputs["inventory"]["all"]["children"]
    ((_, host),) = children["monitoring"]["hosts"].items()
    nodes = children["gpu_nodes"]["hosts"]
    assert nodes and all(h["monitoring_logs_server"] == host["private_ip"] for h in nodes.values())
    exporter = [
        src for target, _, port, src in _ingress(run) if target == "nodes" and port == NODE_EXPORTER
    ]
    assert exporter == ["monitoring"], exporter
    assert ("monitoring", "tcp", JOURNAL, "nodes") in _ingress(run)


# What the host adds to a stack, per cloud: the services subnet and its NAT egress, the
# monitoring group and its rules (on Alibaba also the nodes' scrape rules and an explicit egress
# rule; on AWS the scrape rules are inline in the nodes' group), the host, and on AWS its role.
# The journal's CA (a key, a self-signed certificate) and both ends' keys and certificates.
JOURNAL_TLS = {
    "tls:index/privateKey:PrivateKey": 3,
    "tls:index/selfSignedCert:SelfSignedCert": 1,
    "tls:index/certRequest:CertRequest": 2,
    "tls:index/locallySignedCert:LocallySignedCert": 2,
}
ADDED = {
    "aws": {
        "aws:ec2/subnet:Subnet": 1,
        "aws:ec2/eip:Eip": 1,
        "aws:ec2/natGateway:NatGateway": 1,
        "aws:ec2/routeTable:RouteTable": 1,
        "aws:ec2/routeTableAssociation:RouteTableAssociation": 1,
        SG["aws"]: 1,
        AWS_RULE: 2,
        "aws:iam/role:Role": 1,
        # EC2 discovery; the spend exporter's bill; each end's read of its journal secret
        "aws:iam/rolePolicy:RolePolicy": 4,
        "aws:iam/instanceProfile:InstanceProfile": 1,
        HOST["aws"]: 1,
        # its self-healing (infra/healing.py): recover and reboot alarms
        "aws:cloudwatch/metricAlarm:MetricAlarm": 2,
        # the journal's TLS: each end's certificate, key and CA in its own secret
        "aws:secretsmanager/secret:Secret": 2,
        "aws:secretsmanager/secretVersion:SecretVersion": 2,
        **JOURNAL_TLS,
    },
    "alicloud": {
        "alicloud:vpc/switch:Switch": 1,
        "alicloud:vpc/natGateway:NatGateway": 1,
        "alicloud:ecs/eipAddress:EipAddress": 1,
        "alicloud:ecs/eipAssociation:EipAssociation": 1,
        "alicloud:vpc/snatEntry:SnatEntry": 1,
        SG["alicloud"]: 1,
        ALI_RULE: 5,
        HOST["alicloud"]: 1,
        # the RAM role the spend exporter reads the bill with; each end's read of its journal
        # secret (the host's role and the nodes')
        "alicloud:ram/role:Role": 1,
        "alicloud:ram/policy:Policy": 3,
        "alicloud:ram/rolePolicyAttachment:RolePolicyAttachment": 3,
        "alicloud:kms/secret:Secret": 2,
        **JOURNAL_TLS,
    },
}
# reference prices (compat/catalog.yml, spelled out): instance + NAT gateway per hour, disk per GB
# the host, its NAT gateway and that gateway's public address (compat/catalog.yml)
HOURLY = {"aws": 0.0416 + 0.045 + 0.005, "alicloud": 0.109 + 0.045 + 0.005}
DISK_GB_MONTH = {"aws": 0.08, "alicloud": 0.07}


def _without_monitoring(run) -> None:
    """No trace of the host: no host, no monitoring group or rule naming it, no scrape or
    journal port, no inventory group, no receiver for the nodes, no cost."""
    cloud = run.stack.split("-")[0]
    assert not run.tagged(HOST[cloud], "monitoring")
    assert not [r.name for r in run.custom() if "monitoring" in r.name], run.stack
    assert not [r for r in _ingress(run) if r[2] in (NODE_EXPORTER, JOURNAL)]
    assert "monitoring" not in set(_groups(run).values())
    children = run.outputs["inventory"]["all"]["children"]
    assert "monitoring" not in children
    assert not [
        g
        for g in children.values()
        for key in (g.get("vars") or {})
        if key.startswith(("monitoring_logs_server", "monitoring_logs_tls"))
    ], run.stack
    assert not [r for r in run.resources if "journal" in r.name and r.custom], run.stack
    assert run.outputs["cost"]["monitoring_per_month"] == 0
    assert run.outputs["cost"]["monitoring_instance_type"] == ""


@pytest.mark.parametrize("stack", PROD)
def test_monitoring_is_off_unless_enabled(runs, settings, with_overrides, stack):
    from collections import Counter

    cloud, values = stack.split("-")[0], settings(stack)
    on = runs[stack]
    off = run_offline(stack, with_overrides(stack, monitoring={"enabled": False}))
    _without_monitoring(off)
    if stack == "aws-prod":  # the dev examples leave it off (their TTL forbids it)
        for dev in ("aws-dev", "alicloud-dev"):
            _without_monitoring(runs[dev])
    # what enabling it adds, exactly; nothing it removes
    before = {(r.type, r.name) for r in off.custom()}
    after = {(r.type, r.name) for r in on.custom()}
    assert before <= after, sorted(before - after)
    added = Counter(kind for kind, _ in after - before)
    expected = dict(ADDED[cloud])
    expected[AWS_RULE if cloud == "aws" else ALI_RULE] += len(values["admin_cidrs"]) - 1
    assert dict(added) == expected, dict(added)
    # instance + NAT gateway and its address, all hours, and the disk, in every total
    cost, base = on.outputs["cost"], off.outputs["cost"]
    disk = values["monitoring"]["disk_gb"]
    assert cost["monitoring_per_hour"] == pytest.approx(
        HOURLY[cloud] + disk * DISK_GB_MONTH[cloud] / 730, abs=1e-4
    )
    assert cost["monitoring_per_month"] == pytest.approx(
        HOURLY[cloud] * 730 + disk * DISK_GB_MONTH[cloud], abs=0.01
    )
    for key in ("monthly_worst_case", "monthly_worst_at_max", "monthly_typical"):
        assert cost[key] == pytest.approx(base[key] + cost["monitoring_per_month"], abs=0.02)
    assert cost["spot_cap_per_hour"] == pytest.approx(
        base["spot_cap_per_hour"] + cost["monitoring_per_hour"], abs=2e-4
    )


def _problems(raw: dict, stack: str) -> str:
    with pytest.raises(ConfigError) as err:
        load(raw, stack)
    return str(err.value)


def test_monitoring_config_errors(settings):
    prod = {**settings("aws-prod")}
    msg = _problems(
        {
            **prod,
            "monitoring": {
                "enabled": "yes",
                "instance_type": "g5.xlarge",
                "disk_gb": 10,
                "size": 1,
            },
        },
        "aws-prod",
    )
    for fragment in (
        "torchfleet:monitoring.enabled = 'yes'",
        "true | false",
        "torchfleet:monitoring.instance_type = 'g5.xlarge'",
        "t3.medium",
        "torchfleet:monitoring.disk_gb = 10",
        "30..16384",
        "torchfleet:monitoring.size",
        "enabled, instance_type, disk_gb",
    ):
        assert fragment in msg, fragment
    # even while disabled, a typo is reported
    assert "monitoring.instance_type = 't3.tiny'" in _problems(
        {**prod, "monitoring": {"instance_type": "t3.tiny"}}, "aws-prod"
    )
    dev = {**settings("alicloud-dev"), "monitoring": {"enabled": True}}
    assert "false while ttl_hours is set" in _problems(dev, "alicloud-dev")
    cfg = load({**settings("alicloud-prod"), "monitoring": {"enabled": True}}, "alicloud-prod")
    assert cfg.monitoring.instance_type.name == "ecs.g7.large" and cfg.monitoring.disk_gb == 50
    k8s = {**settings("aws-k8s"), "monitoring": {"enabled": True}}
    assert "false in mode: kubernetes" in _problems(k8s, "aws-k8s")
