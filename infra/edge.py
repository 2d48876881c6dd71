"""The stack's edge: TLS at its load balancer and the API token its clients send.

Contract.
- `Tls`: the `tls` stack key: the certificate (an ACM certificate ARN of the stack's region on
  AWS, a CLB server certificate id on Alibaba, or `generate` on a dev stack), the oldest TLS
  version (1.2 or 1.3; never 1.0 or 1.1) and whether plain HTTP redirects (301) to HTTPS.
  `parse_tls` reads it with infra.config's problem collector, and refuses a stack (dev and prod
  alike) whose load balancer clients outside the VPC reach (`client_cidrs`) without it, and a
  prod stack that asks to generate its certificate, before any resource is registered. (Mode
  instances has no endpoint outside the VPC: infra.config refuses `client_cidrs` there.)
- `generate_certificate(...)`: for `certificate: generate`, a stack CA and the endpoint's
  certificate signed by it for the load balancer's names (pulumi_tls, kept in the state); the
  clouds import them (aws/edge.py into ACM, alicloud/edge.py as a CLB server certificate) and the
  CA is the stack output infra.constants.CA_OUTPUT, which the project's clients (infra/deploy/pipeline.py's
  `auth_of`) trust for that stack alone.
- `tls.backend` (on by default in prod where the cloud can: AWS, mode group): HTTPS from the
  load balancer to the nodes. `node_certificate` makes the nodes' self-signed certificate for
  NODE_NAME (an ALB verifies no target's certificate), which travels to the nodes as the API
  token does, in the cloud secret `node_tls_secret_name(cfg)` (`pem_document`).
- `HTTPS_PORT`, `HTTP_PORT`, `lb_ports(cfg)`: the ports clients reach on a load balancer (443,
  and 80 only to redirect; 80 alone where a stack has no certificate), `endpoint(cfg, host)`.
- `POLICIES`: the load balancers' TLS policy per cloud and oldest version: the only names the
  listeners (aws/edge.py, alicloud/edge.py) and the Kubernetes annotations use.
- The API token: `token(cfg)` is the stack's current token (the `api_token` key, else one
  pulumi_random generates once and keeps in the state), a Pulumi secret; `accepted(cfg)` is what
  the nodes accept (the current one, and `api_token_next` during a rotation: one a line, the
  runtime's api_token_file format); `secret_name(cfg)` names the cloud secret that holds it,
  fixed so user-data and the bundle can name it before it exists and without its value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi
from torchfleet_compat.runtime_settings import FIELDS as RUNTIME_FIELDS
from torchfleet_compat.runtime_settings import parse_value

from infra.constants import CA_OUTPUT

HTTPS_PORT = 443
HTTP_PORT = 80
MIN_VERSIONS = ("1.2", "1.3")
# AWS: ELB security policies (TLS 1.3 with 1.2, or 1.3 alone). Alibaba CLB: its strictest
# policies stop at "1.2 and 1.3"; it has no 1.3-only one.
POLICIES = {
    "aws": {
        "1.2": "ELBSecurityPolicy-TLS13-1-2-2021-06",
        "1.3": "ELBSecurityPolicy-TLS13-1-3-2021-06",
    },
    "alicloud": {"1.2": "tls_cipher_policy_1_2_strict_with_1_3"},
}
TOKEN_LENGTH = 48
# Keys a stack file holds as Pulumi secrets (`pulumi config set --secret`, rotate-token): the
# offline plan and the preflight cannot decrypt them and read `offline_placeholder(key)` instead
# (the program checks the real value when `pulumi up` runs it).
SECRET_KEYS = ("api_token", "api_token_next")
_ACM_ARN = re.compile(
    r"^arn:aws(-cn|-us-gov)?:acm:(?P<region>[a-z0-9-]+):\d{12}:certificate/[0-9a-f-]{36}$"
)
_ALI_CERT = re.compile(r"^[A-Za-z0-9_-]{6,128}$")
SUBKEYS = ("certificate", "min_version", "redirect_http", "backend")
# `tls.backend`: HTTPS from the load balancer to the nodes too. Only an AWS ALB of mode group
# can: an Alibaba CLB's HTTPS listener talks HTTP to its backends, and in mode kubernetes the
# cluster's Service owns that hop.
BACKEND_CLOUDS = ("aws",)
# The name in the nodes' certificate (fixed: the ALB does not verify it, Prometheus's scrape
# checks it with `server_name`), and the nodes' certificate's life: the ALB accepts any
# certificate, expired ones too, so it is made once and kept.
NODE_NAME = "node.torchfleet.internal"
NODE_CERT_VALIDITY_HOURS = 10 * 365 * 24
# `tls: {certificate: generate}`: the stack makes its own CA and certificate (dev stacks only).
GENERATE = "generate"
# A generated certificate's life: a dev stack's CA, and the endpoint's certificate, which a
# `pulumi up` within its renewal window replaces (clients keep trusting the same CA).
CA_VALIDITY_HOURS = 365 * 24
CERT_VALIDITY_HOURS = 90 * 24
CERT_RENEWAL_HOURS = 30 * 24
SERVER_USES = ["digital_signature", "key_encipherment", "server_auth"]  # a TLS server's cert
KEY_BITS = 2048  # RSA: what both ACM's import and Alibaba's CLB server certificates accept


@dataclass(frozen=True)
class Tls:
    certificate: str
    min_version: str = "1.2"
    redirect_http: bool = True
    backend: bool = False  # HTTPS from the load balancer to the nodes (aws, mode group)

    def policy(self, cloud: str) -> str:
        return POLICIES[cloud][self.min_version]

    @property
    def generated(self) -> bool:
        return self.certificate == GENERATE


def parse_tls(
    r: Any,
    raw: dict[str, Any] | None,
    *,
    cloud: str,
    region: str,
    env: str | None,
    mode: str | None,
    client_cidrs: tuple[str, ...],
) -> Tls | None:
    """The `tls` block (r: infra.config's reader); None when unset or wrong."""
    if raw is None:
        # Every environment: a dev endpoint on the internet carries the same bearer token.
        if mode in ("group", "kubernetes") and client_cidrs:
            r.fail(
                "tls",
                None,
                "{certificate, min_version, redirect_http}: a stack whose load balancer "
                f"clients outside the VPC reach (client_cidrs) serves HTTPS only ({env} too)",
            )
        return None
    if mode == "instances":
        r.fail(
            "tls",
            raw,
            "unset in mode: instances (no load balancer; a node serves HTTPS itself with the "
            "inference_runtime role's inference_runtime_tls_cert_file and _key_file)",
        )
        return None
    cert = raw.get("certificate")
    if cert == GENERATE:
        if env == "prod":
            r.fail(
                "tls.certificate",
                cert,
                "a certificate a public CA issued (an ACM certificate ARN on aws, a CLB server "
                "certificate id on alicloud): a prod endpoint's clients must trust it without "
                "the stack's own CA; generate is for dev stacks",
            )
            cert = None
        elif mode == "kubernetes":
            r.fail(
                "tls.certificate",
                cert,
                "a certificate the cloud holds in mode: kubernetes (the Service's load balancer "
                "is named only after its certificate is set); generate is for mode: group",
            )
            cert = None
    elif cloud == "aws":
        m = _ACM_ARN.match(cert) if isinstance(cert, str) else None
        if not m or m.group("region") != region:
            r.fail(
                "tls.certificate",
                cert,
                f"an ACM certificate ARN in the stack's region {region} "
                "(arn:aws:acm:<region>:<account>:certificate/<id>)",
            )
            cert = None
    elif not (isinstance(cert, str) and _ALI_CERT.match(cert)):
        r.fail("tls.certificate", cert, "the id of a CLB server certificate in the stack's region")
        cert = None
    allowed = tuple(POLICIES[cloud])
    version = str(raw.get("min_version", "1.2"))
    if version not in allowed:
        r.fail(
            "tls.min_version",
            raw.get("min_version"),
            " | ".join(allowed) + f" on {cloud} (TLS 1.0 and 1.1 are never served)",
        )
    redirect = r.boolean("tls.redirect_http", raw.get("redirect_http", True))
    backend = _backend(r, raw, cloud=cloud, env=env, mode=mode)
    if cert is None or version not in allowed or redirect is None or backend is None:
        return None
    return Tls(certificate=cert, min_version=version, redirect_http=redirect, backend=backend)


def backend_tls(cfg: Any) -> bool:
    """Whether the stack's load balancer speaks HTTPS to its nodes (`tls.backend`)."""
    return cfg.tls is not None and cfg.tls.backend


def backend_possible(cloud: str, mode: str | None) -> bool:
    return cloud in BACKEND_CLOUDS and mode == "group"


def _backend(
    r: Any, raw: dict[str, Any], *, cloud: str, env: str | None, mode: str | None
) -> bool | None:
    """`tls.backend`: default true in prod where the cloud can, false elsewhere; true where
    it cannot is refused with the reason."""
    possible = backend_possible(cloud, mode)
    if "backend" not in raw:
        return env == "prod" and possible
    value = r.boolean("tls.backend", raw["backend"])
    if value and not possible:
        reason = (
            "an Alibaba CLB's HTTPS listener talks HTTP to its backends"
            if cloud == "alicloud"
            else "in mode kubernetes the cluster's Service carries that hop"
        )
        r.fail("tls.backend", value, f"false on {cloud} in mode {mode} ({reason})")
        return None
    return value


@dataclass(frozen=True)
class Generated:
    """A generated certificate (PEM outputs): the endpoint's certificate, its key (a Pulumi
    secret) and the stack CA that signed it (the chain, and what clients trust)."""

    certificate: pulumi.Output[str]
    private_key: pulumi.Output[str]
    ca: pulumi.Output[str]


def make_ca(
    name: str, common_name: str, opts: pulumi.ResourceOptions, *, validity_hours: int
) -> tuple[Any, Any]:
    """A CA kept in the state (its key, and a self-signed certificate allowed to sign only)."""
    import pulumi_tls as tls

    key = tls.PrivateKey(f"{name}-ca-key", algorithm="RSA", rsa_bits=KEY_BITS, opts=opts)
    ca = tls.SelfSignedCert(
        f"{name}-ca",
        private_key_pem=key.private_key_pem,
        is_ca_certificate=True,
        subject=tls.SelfSignedCertSubjectArgs(common_name=common_name, organization="torchfleet"),
        validity_period_hours=validity_hours,
        early_renewal_hours=CERT_RENEWAL_HOURS,
        allowed_uses=["cert_signing", "crl_signing"],
        opts=opts,
    )
    return key, ca


def sign(
    name: str,
    ca: tuple[Any, Any],
    common_name: str,
    uses: list[str],
    opts: pulumi.ResourceOptions,
    *,
    validity_hours: int = CERT_VALIDITY_HOURS,
    dns_names: pulumi.Input[list[str]] | None = None,
    ip_addresses: pulumi.Input[list[str]] | None = None,
) -> Generated:
    """A key and a certificate for `dns_names` / `ip_addresses` signed by `ca` (make_ca's),
    kept in the state until its renewal window (a `pulumi up` then makes a new one)."""
    import pulumi_tls as tls

    ca_key, ca_cert = ca
    key = tls.PrivateKey(f"{name}-key", algorithm="RSA", rsa_bits=KEY_BITS, opts=opts)
    request = tls.CertRequest(
        name,
        private_key_pem=key.private_key_pem,
        subject=tls.CertRequestSubjectArgs(common_name=common_name, organization="torchfleet"),
        dns_names=dns_names,
        ip_addresses=ip_addresses,
        opts=opts,
    )
    cert = tls.LocallySignedCert(
        name,
        cert_request_pem=request.cert_request_pem,
        ca_private_key_pem=ca_key.private_key_pem,
        ca_cert_pem=ca_cert.cert_pem,
        validity_period_hours=validity_hours,
        early_renewal_hours=CERT_RENEWAL_HOURS,
        allowed_uses=uses,
        opts=opts,
    )
    return Generated(
        certificate=cert.cert_pem,
        private_key=pulumi.Output.secret(key.private_key_pem),
        ca=ca_cert.cert_pem,
    )


def generate_certificate(
    name: str,
    cfg: Any,
    opts: pulumi.ResourceOptions,
    *,
    dns_names: pulumi.Input[list[str]] | None = None,
    ip_addresses: pulumi.Input[list[str]] | None = None,
) -> Generated:
    """The stack's CA (a self-signed certificate allowed to sign only) and the endpoint's
    certificate for `dns_names` / `ip_addresses` (the load balancer's name or address), both
    kept in the state: the same on every later `up` until the endpoint's renewal window."""
    subject = f"torchfleet {cfg.stack}"
    ca = make_ca(name, f"{subject} CA", opts, validity_hours=CA_VALIDITY_HOURS)
    return sign(
        f"{name}-endpoint",
        ca,
        subject,
        SERVER_USES,
        opts,
        dns_names=dns_names,
        ip_addresses=ip_addresses,
    )


def node_certificate(name: str, cfg: Any, opts: pulumi.ResourceOptions) -> Generated:
    """`tls.backend`: the nodes' certificate, self-signed for NODE_NAME and kept in the state
    (one for every node of the stack: the ALB verifies no target's certificate, so a long-lived
    self-signed one serves; its certificate is also the CA Prometheus's scrape trusts)."""
    import pulumi_tls as tls

    key = tls.PrivateKey(f"{name}-node-tls-key", algorithm="RSA", rsa_bits=KEY_BITS, opts=opts)
    cert = tls.SelfSignedCert(
        f"{name}-node-tls",
        private_key_pem=key.private_key_pem,
        subject=tls.SelfSignedCertSubjectArgs(
            common_name=f"torchfleet {cfg.stack} nodes", organization="torchfleet"
        ),
        dns_names=[NODE_NAME],
        validity_period_hours=NODE_CERT_VALIDITY_HOURS,
        allowed_uses=SERVER_USES,
        opts=opts,
    )
    # self-signed: the certificate is its own CA
    return Generated(cert.cert_pem, pulumi.Output.secret(key.private_key_pem), cert.cert_pem)


def pem_document(made: Generated, *, with_ca: bool = False) -> pulumi.Output[str]:
    """A certificate and its key as a secret holds them (JSON: certificate, private_key and,
    `with_ca`, ca; torchfleet_agent's `node-tls` and `journal-tls` read it), a Pulumi secret."""
    parts = {"certificate": made.certificate, "private_key": made.private_key}
    if with_ca:
        parts["ca"] = made.ca
    return pulumi.Output.secret(pulumi.Output.all(**parts).apply(json.dumps))


def listener_certificate(
    name: str,
    cfg: Any,
    opts: pulumi.ResourceOptions,
    upload: Callable[[Generated], pulumi.Output[str]],
    **names: pulumi.Input[list[str]],
) -> tuple[pulumi.Input[str], dict[str, pulumi.Output[str]]]:
    """What an HTTPS listener serves, and the stack outputs that adds: the stack's `tls`
    certificate as given, or (`generate`) one made for `names` (generate_certificate's
    dns_names / ip_addresses) and stored by the cloud's `upload` (which returns the id the
    listener names), with its CA as the output CA_OUTPUT."""
    if not cfg.tls.generated:
        return cfg.tls.certificate, {}
    made = generate_certificate(name, cfg, opts, **names)
    return upload(made), {CA_OUTPUT: made.ca}


def check_token(r: Any, key: str, value: Any) -> str | None:
    """A given token, checked as the runtime checks its api_token (never shown in the error)."""
    if value is None:
        return None
    try:
        return str(parse_value("api_token", value))
    except ValueError as exc:
        r.fail(key, "(secret)", RUNTIME_FIELDS["api_token"].allowed + f" ({exc})")
        return None


def offline_placeholder(key: str) -> str:
    return f"not-decrypted-offline-{key}"


def secret_name(cfg: Any) -> str:
    """The cloud secret of the stack's tokens (AWS Secrets Manager allows /, Alibaba KMS not)."""
    return f"torchfleet/{cfg.stack}/api-token" if cfg.cloud == "aws" else f"{cfg.name}-api-token"


def node_tls_secret_name(cfg: Any) -> str:
    """The cloud secret of the nodes' certificate and key (`tls.backend`), fixed like
    secret_name so the inventory can name it."""
    return f"torchfleet/{cfg.stack}/node-tls"


def token(cfg: Any, opts: pulumi.ResourceOptions | None = None) -> pulumi.Output[str]:
    """The current token as a Pulumi secret: the stack's `api_token`, else a generated one
    (pulumi_random keeps it in the state: the same token on every later `up`)."""
    if cfg.api_token:
        return pulumi.Output.secret(cfg.api_token)
    import pulumi_random

    generated = pulumi_random.RandomPassword(
        "api-token", length=TOKEN_LENGTH, special=False, opts=opts
    )
    return pulumi.Output.secret(generated.result)


def accepted(cfg: Any, current: pulumi.Output[str]) -> pulumi.Output[str]:
    """What the nodes accept: the current token, and during a rotation the next; one a line."""
    following = cfg.api_token_next
    return pulumi.Output.secret(
        current.apply(lambda t: f"{t}\n" + (f"{following}\n" if following else ""))
    )


def lb_ports(cfg: Any, can_redirect: bool = True) -> tuple[int, ...]:
    """The ports a stack's load balancer listens on: HTTPS (and HTTP only to redirect, where the
    balancer can: an NLB cannot), or plain HTTP where no certificate is given (a dev or
    VPC-internal stack)."""
    if cfg.tls is None:
        return (HTTP_PORT,)
    redirect = cfg.tls.redirect_http and can_redirect
    return (HTTPS_PORT, HTTP_PORT) if redirect else (HTTPS_PORT,)


def endpoint(cfg: Any, host: str) -> str:
    return f"{'https' if cfg.tls else 'http'}://{host}/"
