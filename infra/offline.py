"""Run the program under Pulumi's mock engine: no CLI, no credentials, no cloud calls.

Shared by the offline plan and the tests. The mocks answer the invokes the program makes and
fail loudly on any other, and `run_offline` fails when the program registered nothing or its
outputs never resolved: the mock engine's usual silent passes become errors."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import settings
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra.constants import PROJECT

FAKE_AMI = "ami-0123456789abcdef0"
FAKE_ALI_IMAGE = "ubuntu_22_04_x64_20G_alibase_20240130.vhd"
FAKE_ACCOUNT = "123456789012"
FAKE_ALI_ACCOUNT = "1208863178610000"
FAKE_BAKED_AMI = "ami-0fedcba9876543210"


class UnexpectedInvoke(RuntimeError):
    pass


@dataclass
class Registered:
    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any] = field(default_factory=dict)
    # Resource options as the engine saw them: URNs depended on, replace-on-changes properties.
    dependencies: tuple[str, ...] = ()
    replace_on_changes: tuple[str, ...] = ()
    secrets: frozenset[str] = frozenset()  # input properties that carried a Pulumi secret


@dataclass
class OfflineRun:
    stack: str
    resources: list[Registered]
    outputs: dict[str, Any]
    calls: list[str]
    secret_outputs: frozenset[str] = frozenset()

    def custom(self) -> list[Registered]:
        """Cloud resources (not components, not providers, not the stack)."""
        return [r for r in self.resources if r.custom and not r.type.startswith("pulumi:")]

    def of_type(self, type_: str) -> list[Registered]:
        return [r for r in self.resources if r.type == type_]

    def tagged(self, type_: str, role: str) -> list[Registered]:
        """Resources of `type_` whose `torchfleet-role` tag is `role` (gpu-node, monitoring)."""
        return [
            r
            for r in self.of_type(type_)
            if (r.inputs.get("tags") or {}).get("torchfleet-role") == role
        ]


# How the engine hands a secret value to a mock: this signature key beside the value.
_SECRET_SIG = "4dabf18193072939515e22adb298388d"


def _reveal(value: Any, key: str, found: set[str]) -> Any:
    """`value` with every secret wrapper replaced by what it wraps; `key` recorded in `found`
    when one was there."""
    if isinstance(value, dict):
        if _SECRET_SIG in value and "value" in value:
            found.add(key)
            return _reveal(value["value"], key, found)
        return {k: _reveal(v, key, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_reveal(v, key, found) for v in value]
    return value


def offline_token(name: str) -> str:
    """What the mock engine's pulumi_random hands out: a token of the runtime's characters that
    a test can look for in everything the program wrote."""
    return "offline" + hashlib.sha256(name.encode()).hexdigest()[:40]


# What the mock engine's pulumi_tls hands out: a PEM block naming the resource, so a test can
# follow a generated certificate from its key to the cloud's import.
OFFLINE_PEM = {
    "tls:index/privateKey:PrivateKey": ("privateKeyPem", "PRIVATE KEY"),
    "tls:index/selfSignedCert:SelfSignedCert": ("certPem", "CERTIFICATE"),
    "tls:index/certRequest:CertRequest": ("certRequestPem", "CERTIFICATE REQUEST"),
    "tls:index/locallySignedCert:LocallySignedCert": ("certPem", "CERTIFICATE"),
}


def offline_pem(label: str, name: str) -> str:
    return f"-----BEGIN {label}-----\noffline {name}\n-----END {label}-----\n"


def _octet(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:2], 16) % 200 + 10


class OfflineMocks(pulumi.runtime.Mocks):
    """Plausible outputs for what the program reads back (addresses, names, ARNs)."""

    def __init__(self) -> None:
        self.inputs: dict[tuple[str, str], dict[str, Any]] = {}
        # the input properties (top level) that carried a Pulumi secret
        self.secret_inputs: dict[tuple[str, str], frozenset[str]] = {}
        self.calls: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        secrets: set[str] = set()
        inputs = {k: _reveal(v, k, secrets) for k, v in args.inputs.items()}
        self.inputs[(args.typ, args.name)] = inputs
        self.secret_inputs[(args.typ, args.name)] = frozenset(secrets)
        out = dict(inputs)
        rid = f"{args.name}-id"
        n = _octet(args.name)
        if args.typ in ("aws:ec2/instance:Instance", "alicloud:ecs/instance:Instance"):
            # A private address the program fixed is kept; no public one where none is asked.
            public = (
                args.inputs.get("associatePublicIpAddress") is not False
                and args.inputs.get("internetMaxBandwidthOut", 1) != 0
            )
            out.update(
                publicIp=f"203.0.113.{n}" if public else "",
                privateIp=args.inputs.get("privateIp") or f"10.42.0.{n}",
            )
            if args.typ.startswith("aws:"):
                out["spotInstanceRequestId"] = f"sir-{n:08x}"
        elif args.typ == "aws:lb/loadBalancer:LoadBalancer":
            out["dnsName"] = f"{args.name}.elb.example.internal"
            out["arnSuffix"] = f"app/{args.name}/{n:016x}"
        elif args.typ == "aws:lb/targetGroup:TargetGroup":
            out["arnSuffix"] = f"targetgroup/{args.name}/{n:016x}"
        elif args.typ in ("aws:s3/bucket:Bucket", "alicloud:oss/bucket:Bucket"):
            out.setdefault("bucket", f"{args.inputs.get('bucketPrefix', 'torchfleet-')}offline{n}")
            rid = out["bucket"]
            if args.typ.startswith("aws:"):
                out["arn"] = f"arn:aws:s3:::{rid}"
        elif args.typ == "aws:imagebuilder/image:Image":
            out["outputResources"] = [{"amis": [{"image": FAKE_BAKED_AMI}]}]
        elif args.typ == "alicloud:ess/scalingRule:ScalingRule":
            out["ari"] = f"ari:acs:ess:offline:123456789012:scalingrule/{rid}"
        elif args.typ == "alicloud:cms/monitorGroup:MonitorGroup":
            rid = str(1000 + n)  # CloudMonitor application group ids are numbers
        elif args.typ == "alicloud:slb/applicationLoadBalancer:ApplicationLoadBalancer":
            out["address"] = f"198.51.100.{n}"
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            out["latestVersion"] = 1
        elif args.typ == "random:index/randomPassword:RandomPassword":
            out["result"] = offline_token(args.name)
        elif args.typ in OFFLINE_PEM:
            attr, label = OFFLINE_PEM[args.typ]
            out[attr] = offline_pem(label, args.name)
        out.update(_kubernetes_mode_outputs(args.typ, args.name, n))
        if args.typ.startswith("aws:"):
            out.setdefault("arn", f"arn:aws:{args.typ.split(':')[1].split('/')[0]}:::{rid}")
            out.setdefault("name", args.inputs.get("name") or f"{args.name}-name")
            if args.typ == "aws:ec2/keyPair:KeyPair":
                out["keyName"] = f"{args.name}-key"
        return rid, out

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:  # type: ignore[override]
        self.calls.append(args.token)
        if args.token == "aws:ec2/getAmi:getAmi":
            return {"id": FAKE_AMI, "imageId": FAKE_AMI, "name": "offline-plan-image"}
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "accountId": FAKE_ACCOUNT,
                "arn": f"arn:aws:iam::{FAKE_ACCOUNT}:user/offline",
                "id": FAKE_ACCOUNT,
                "userId": "OFFLINE",
            }
        if args.token == "alicloud:index/getAccount:getAccount":
            return {"id": FAKE_ALI_ACCOUNT}
        if args.token == "alicloud:ecs/getImages:getImages":
            return {
                "id": "images",
                "ids": [FAKE_ALI_IMAGE],
                "images": [{"id": FAKE_ALI_IMAGE, "name": FAKE_ALI_IMAGE}],
            }
        if args.token in KUBERNETES_MODE_INVOKES:
            return KUBERNETES_MODE_INVOKES[args.token](args.args)
        raise UnexpectedInvoke(f"the offline mocks do not answer {args.token!r}")


# -- mode: kubernetes: what the clusters hand back ---------------------------------------------

FAKE_KUBECONFIG = (
    '{"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []}'
)
# The newest ACK patch release per minor the offline plan pretends the region offers.
FAKE_ACK_VERSIONS = ("1.33.3-aliyun.1", "1.34.2-aliyun.1", "1.35.1-aliyun.1")


def _kubernetes_mode_outputs(typ: str, name: str, n: int) -> dict[str, Any]:
    if typ == "aws:eks/cluster:Cluster":
        return {
            "endpoint": f"https://{n:02X}EXAMPLE.gr7.eks.example.internal",
            "certificateAuthority": {"data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t"},
            "identities": [
                {"oidcs": [{"issuer": f"https://oidc.eks.example.internal/id/{n:02X}EXAMPLE"}]}
            ],
            "vpcConfig": {"clusterSecurityGroupId": f"sg-0{n:016x}"},
        }
    if typ == "aws:eks/nodeGroup:NodeGroup":
        return {"resources": [{"autoscalingGroups": [{"name": f"eks-{name}-asg"}]}]}
    if typ == "alicloud:cs/managedKubernetes:ManagedKubernetes":
        return {
            "slbId": f"lb-{name}",
            "rrsaMetadata": {
                "enabled": True,
                "rrsaOidcIssuerUrl": f"https://oidc-ack.example.internal/{name}",
                "ramOidcProviderName": f"ack-rrsa-{name}",
                "ramOidcProviderArn": f"acs:ram::123456789:oidc-provider/ack-rrsa-{name}",
            },
        }
    if typ == "alicloud:cs/nodePool:NodePool":
        return {"scalingGroupId": f"asg-{name}", "nodePoolId": f"np-{name}"}
    return {}


KUBERNETES_MODE_INVOKES = {
    "alicloud:cs/getClusterCredential:getClusterCredential": lambda args: {
        "id": "credential",
        "clusterId": args.get("clusterId"),
        "kubeConfig": FAKE_KUBECONFIG,
        "certificateAuthorities": [],
        "expiration": "2026-03-03T10:17:00Z",
    },
    "alicloud:cs/getKubernetesVersion:getKubernetesVersion": lambda args: {
        "id": "versions",
        "clusterType": args.get("clusterType"),
        "metadatas": [{"version": v, "runtimes": []} for v in FAKE_ACK_VERSIONS],
    },
}


class RecordingMonitor(MockMonitor):
    """Remembers each registration's parent, which the plain mock monitor drops."""

    def __init__(self, mocks: OfflineMocks) -> None:
        super().__init__(mocks)
        self.registrations: list[tuple[str, str, str, str, bool]] = []
        self.options: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def RegisterResource(self, request: Any) -> Any:  # the gRPC method it overrides
        response = super().RegisterResource(request)
        self.registrations.append(
            (response.urn, request.type, request.name, request.parent, bool(request.custom))
        )
        self.options[response.urn] = (tuple(request.dependencies), tuple(request.replaceOnChanges))
        return response


def config_strings(values: dict[str, Any]) -> dict[str, str]:
    """Pulumi hands every config value over as a string; structured ones as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}


def run_offline(
    stack: str,
    config_values: dict[str, Any],
    monitor: RecordingMonitor | None = None,
    prices: str = "offline",
) -> OfflineRun:
    """Run the program for `stack` with `config_values` (full keys, e.g. "torchfleet:region").
    Pass a `monitor` to see what was registered even when the program raises. `prices`: the
    pricing mode (infra.pricing; `offline` by default: the reference table, no cloud call)."""
    from infra import program  # imported here: the caller may set TORCHFLEET_* env first

    settings.ROOT.set(None)  # a fresh root stack per run, not the previous run's
    monitor = monitor or RecordingMonitor(OfflineMocks())
    mocks = monitor.mocks
    assert isinstance(mocks, OfflineMocks)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(config_strings(config_values))
    resolved: dict[str, Any] = {}
    exported: dict[str, Any] = {}

    def body() -> Any:
        outputs = program.run(prices)
        exported.update(outputs)
        return pulumi.Output.all(**outputs).apply(lambda values: resolved.update(values))

    _sync_await(run_pulumi_func(lambda: _sync_await(pulumi.Output.from_input(body()).future())))
    resources = [
        Registered(
            urn,
            typ,
            name,
            parent,
            custom,
            mocks.inputs.get((typ, name), {}),
            *monitor.options.get(urn, ((), ())),
            mocks.secret_inputs.get((typ, name), frozenset()),
        )
        for urn, typ, name, parent, custom in monitor.registrations
    ]
    secret_outputs = frozenset(
        key
        for key, value in exported.items()
        if isinstance(value, pulumi.Output) and _sync_await(value.is_secret())
    )
    if not [r for r in resources if r.custom and not r.type.startswith("pulumi:")]:
        raise RuntimeError(f"stack {stack}: the program registered no cloud resource")
    if not resolved:
        raise RuntimeError(f"stack {stack}: the program's outputs never resolved")
    return OfflineRun(
        stack=stack,
        resources=resources,
        outputs=resolved,
        calls=mocks.calls,
        secret_outputs=secret_outputs,
    )
