"""The Alibaba Cloud edge of a stack: the CLB's listeners (HTTPS with the stack's server
certificate and a TLS policy refusing 1.0/1.1, forwarding to the VServer group, with the
rollout's sticky_s as an inserted cookie; HTTP only redirecting) and the API token as a KMS
secret, which only the node role may read (RAM: kms:GetSecretValue on that secret); each end's
journal certificate (infra.monitoring.journal_tls) alike, in its own secret (journal_store).
With `tls: {certificate: generate}` (dev stacks), the HTTPS listener serves a certificate the
stack generates for the CLB's address (infra.edge.generate_certificate), uploaded as a CLB server
certificate; `listeners` returns the stack outputs that adds (the CA)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pulumi
import pulumi_alicloud as alicloud

from infra import edge, monitoring
from infra.config import StackConfig
from infra.constants import HEALTH_PATH

HEALTH_CHECK = {
    "health_check": "on",
    "health_check_type": "http",
    "health_check_uri": HEALTH_PATH,
    "health_check_http_code": "http_2xx",
    "health_check_interval": 5,
    "health_check_timeout": 5,
    "healthy_threshold": 2,
    "unhealthy_threshold": 3,
}


def listeners(
    name: str,
    cfg: StackConfig,
    clb: alicloud.slb.ApplicationLoadBalancer,
    backends: alicloud.slb.ServerGroup,
    acl_args: dict[str, Any],
    opts: pulumi.ResourceOptions,
) -> dict[str, pulumi.Output[str]]:
    """The listeners; the serving one forwards to `backends`, the VServer group the scaling
    groups attach their nodes to (each group at its own weight: the rollout's split). Returns
    the stack outputs they add ({CA_OUTPUT: PEM} where the stack generates its
    certificate, else none)."""
    forward = {
        "load_balancer_id": clb.id,
        "server_group_id": backends.id,
        "backend_port": cfg.service_port,
        "bandwidth": -1,
        "health_check_connect_port": cfg.service_port,
        **HEALTH_CHECK,
        **acl_args,
    }
    if cfg.rollout is not None and cfg.rollout.sticky_s:
        # An A/B that holds per client: the CLB inserts a cookie naming the node a client first
        # reached, and each node serves one track (a node that leaves moves its clients).
        forward.update(
            sticky_session="on", sticky_session_type="insert", cookie_timeout=cfg.rollout.sticky_s
        )
    if cfg.tls is None:  # no certificate: a dev or VPC-internal stack (infra.edge.parse_tls)
        alicloud.slb.Listener(
            f"{name}-http", frontend_port=edge.HTTP_PORT, protocol="http", **forward, opts=opts
        )
        return {}
    certificate, outputs = edge.listener_certificate(
        name,
        cfg,
        opts,
        # the CLB sends what its server certificate holds: the endpoint's, then the CA
        lambda made: (
            alicloud.slb.ServerCertificate(
                f"{name}-generated",
                name=f"{cfg.name}-generated",
                server_certificate=pulumi.Output.concat(made.certificate, made.ca),
                private_key=made.private_key,
                opts=opts,
            ).id
        ),
        ip_addresses=clb.address.apply(lambda a: [a]),
    )
    https = alicloud.slb.Listener(
        f"{name}-https",
        frontend_port=edge.HTTPS_PORT,
        protocol="https",
        server_certificate_id=certificate,
        tls_cipher_policy=cfg.tls.policy("alicloud"),
        **forward,
        opts=opts,
    )
    if cfg.tls.redirect_http:
        alicloud.slb.Listener(
            f"{name}-http",
            load_balancer_id=clb.id,
            frontend_port=edge.HTTP_PORT,
            protocol="http",
            bandwidth=-1,
            listener_forward="on",  # the CLB answers HTTP with a redirect to HTTPS, nothing else
            forward_port=edge.HTTPS_PORT,
            **acl_args,
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[https])),
        )
    return outputs


def _kms_secret(
    name: str,
    secret_name: str,
    description: str,
    value: pulumi.Output[str],
    tags: dict[str, str],
    opts: Any,
) -> alicloud.kms.Secret:
    """A KMS secret holding `value`. KMS wants a version id per value: 12 hex digits of the
    value's SHA-256 (a new value, a new version; they say nothing a 48-character random token or
    a PEM document would give away)."""
    return alicloud.kms.Secret(
        name,
        secret_name=secret_name,
        description=description,
        secret_data=value,
        version_id=value.apply(lambda t: "v" + hashlib.sha256(t.encode()).hexdigest()[:12]),
        force_delete_without_recovery=True,
        tags=tags,
        opts=opts,
    )


def token_store(
    name: str, cfg: StackConfig, token: pulumi.Output[str], tags: dict[str, str], opts: Any
) -> alicloud.kms.Secret:
    """The KMS secret the nodes read their accepted tokens from (infra.edge.accepted)."""
    return _kms_secret(
        f"{name}-api-token",
        edge.secret_name(cfg),
        f"torchfleet {cfg.stack}: the API tokens the nodes accept, one a line",
        edge.accepted(cfg, token),
        tags,
        opts,
    )


def journal_store(
    name: str,
    cfg: StackConfig,
    end: str,
    made: edge.Generated,
    tags: dict[str, str],
    opts: Any,
) -> alicloud.kms.Secret:
    """One end of the journal's TLS (infra.monitoring.journal_tls): its certificate, key and the
    journal CA, in the KMS secret only that end's RAM role reads (secret_read_policy)."""
    return _kms_secret(
        f"{name}-journal-{end}",
        monitoring.journal_secret_name(cfg, end),
        f"torchfleet {cfg.stack}: the journal {end}'s certificate, key and CA",
        edge.pem_document(made, with_ca=True),
        tags,
        opts,
    )


def secret_read_policy(cfg: StackConfig, secret_name: str) -> str:
    """kms:GetSecretValue on one secret of the stack's region and nothing else."""
    return json.dumps(
        {
            "Version": "1",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["kms:GetSecretValue"],
                    "Resource": [f"acs:kms:{cfg.region}:*:secret/{secret_name}"],
                }
            ],
        }
    )


def read_policy(cfg: StackConfig) -> str:
    return secret_read_policy(cfg, edge.secret_name(cfg))


# What a node calls to leave before it drains: its own weight to 0 in the VServer group the
# listeners forward to (torchfleet_agent/alicloud.py). RAM authorises VServer group calls on the
# load balancer the group belongs to.
LEAVE_ACTION = "slb:SetVServerGroupAttribute"


def leave_policy(cfg: StackConfig, load_balancer_id: str) -> str:
    """What a node needs to set its own weight in the VServer group to 0 before it drains."""
    return json.dumps(
        {
            "Version": "1",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": [LEAVE_ACTION],
                    "Resource": [f"acs:slb:{cfg.region}:*:loadbalancer/{load_balancer_id}"],
                }
            ],
        }
    )
