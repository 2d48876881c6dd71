"""The network section: the VPC, who may reach the nodes and the service, and how (SSH keys,
Session Manager, TLS at the load balancer, the bearer tokens).

Each key is one field of `Network` (infra/config/keys.py says how a key is declared). The
`tls` block and the tokens are judged by infra/edge.py, which owns their rules.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra import edge
from infra.config.keys import REQUIRED, key
from infra.config.reader import MIN_CIDR_PREFIX, Reader
from infra.constants import SERVICE_PORT

SSH_KEY_PREFIXES = (
    "ssh-ed25519 ",
    "ssh-rsa ",
    "ecdsa-sha2-nistp256 ",
    "ecdsa-sha2-nistp384 ",
    "ecdsa-sha2-nistp521 ",
    "sk-ssh-ed25519@openssh.com ",
)


def _admin_cidrs(r: Reader, got: Mapping[str, Any]) -> tuple[str, ...]:
    admin = r.cidrs("admin_cidrs", r.structured("admin_cidrs", list))
    if not admin and "admin_cidrs" not in r.raw:
        r.fail("admin_cidrs", None, "at least one CIDR that may reach SSH (port 22)")
    return admin


def _client_cidrs(r: Reader, got: Mapping[str, Any]) -> tuple[str, ...]:
    return r.cidrs("client_cidrs", r.structured("client_cidrs", list))


def _service_port(r: Reader, got: Mapping[str, Any]) -> int | None:
    return r.number("service_port", r.get("service_port"), int, 1024, 65535)


def _ssh_public_key(r: Reader, got: Mapping[str, Any]) -> str | None:
    value = r.get("ssh_public_key")
    if not isinstance(value, str) or not value.startswith(SSH_KEY_PREFIXES):
        r.fail(
            "ssh_public_key",
            value if not isinstance(value, str) else value[:24] + "...",
        )
        return None
    return value.strip()


def _vpc_cidr(r: Reader, got: Mapping[str, Any]) -> str:
    value = r.get("vpc_cidr")
    try:
        net = ipaddress.ip_network(str(value))
        if net.version != 4 or not net.is_private or not 16 <= net.prefixlen <= 22:
            raise ValueError
    except ValueError:
        r.fail("vpc_cidr", value, "a private IPv4 network of /16../22 such as 10.42.0.0/16")
        return "10.42.0.0/16"
    return str(net)


def _access(r: Reader, got: Mapping[str, Any]) -> bool:
    """`access.ssm`: Session Manager on the nodes, only where the stack asks (AWS only)."""
    raw = r.structured("access", dict) or {}
    ssm = r.boolean("access.ssm", raw.get("ssm", False))
    if ssm and got["cloud"] != "aws":
        r.fail("access.ssm", True, "false on alicloud (Session Manager is AWS's)")
        return False
    return bool(ssm)


def _tls(r: Reader, got: Mapping[str, Any]) -> edge.Tls | None:
    return edge.parse_tls(
        r,
        r.structured("tls", dict),
        cloud=got["cloud"],
        region=got["region"] or "",
        env=got["env"],
        mode=got["mode"],
        client_cidrs=got["client_cidrs"],
    )


def _api_token(r: Reader, got: Mapping[str, Any]) -> str | None:
    return edge.check_token(r, "api_token", r.get("api_token"))


def _api_token_next(r: Reader, got: Mapping[str, Any]) -> str | None:
    token = edge.check_token(r, "api_token_next", r.get("api_token_next"))
    if token is not None and token == got["api_token"]:
        r.fail("api_token_next", "(secret)", "a token other than api_token")
    return token


@dataclass(frozen=True, kw_only=True)
class Network:
    admin_cidrs: tuple[str, ...] = key(
        "list",
        "who may reach SSH (port 22)",
        f"CIDRs of /{MIN_CIDR_PREFIX} or narrower",
        REQUIRED,
        parse=_admin_cidrs,
    )
    client_cidrs: tuple[str, ...] = key(
        "list",
        "who may reach the service",
        f"CIDRs of /{MIN_CIDR_PREFIX} or narrower (unset: the VPC only)",
        [],
        parse=_client_cidrs,
    )
    service_port: int = key(
        "integer",
        "the runtime's port on the nodes",
        "1024..65535",
        SERVICE_PORT,
        parse=_service_port,
    )
    ssh_public_key: str = key(
        "string",
        "the operator's OpenSSH public key",
        "an OpenSSH public key line (" + ", ".join(p.strip() for p in SSH_KEY_PREFIXES) + ")",
        REQUIRED,
        parse=_ssh_public_key,
    )
    vpc_cidr: str = key(
        "string",
        "the stack's VPC range",
        "a private IPv4 network of /16../22",
        "10.42.0.0/16",
        parse=_vpc_cidr,
    )
    # access.ssm: AWS Session Manager on the nodes (docs/security.md)
    ssm: bool = key(
        "mapping",
        "how operators reach the nodes besides SSH from admin_cidrs (docs/security.md)",
        "ssm true | false (AWS: the nodes' role gets AmazonSSMManagedInstanceCore: Session "
        "Manager shells and Run Command on them; default false)",
        subkeys=("ssm",),
        name="access",
        parse=_access,
    )
    tls: edge.Tls | None = key(  # None: plain HTTP at the load balancer (never public)
        "mapping",
        "HTTPS at the load balancer (required for a stack with client_cidrs, dev included)",
        "certificate (an ACM ARN on aws, a CLB server certificate id on alicloud, or generate: "
        "a dev group stack's own CA, its PEM the output tls_ca_pem), "
        "min_version 1.2 | 1.3 (1.2 on alicloud), redirect_http (default true: HTTP answers 301), "
        "backend true | false (HTTPS from the load balancer to the nodes: default true in prod "
        "on aws in mode group, false elsewhere; refused on alicloud and in mode kubernetes)",
        subkeys=edge.SUBKEYS,
        parse=_tls,
    )
    api_token: str | None = key(  # None: generated (infra.edge)
        "string",
        "the bearer token clients send (set it as a Pulumi secret)",
        "16-512 of A-Z a-z 0-9 . _ ~ + / = -",
        derived="generated once (pulumi_random), kept as a Pulumi secret",
        parse=_api_token,
        secret=True,
    )
    api_token_next: str | None = key(  # during a rotation only
        "string",
        "the next token during a rotation: nodes accept both (torchfleet rotate-token sets it)",
        "16-512 of A-Z a-z 0-9 . _ ~ + / = -, not api_token",
        parse=_api_token_next,
        secret=True,
    )
