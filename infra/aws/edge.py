"""The AWS edge of a stack: the ALB's listeners (HTTPS with an ELB TLS policy; HTTP only
redirecting, 301) and the API token in Secrets Manager, readable by the node role alone (IAM:
GetSecretValue on that secret and nothing else; the operator's own credentials are the only
other reader). The policies and ports are infra.edge's."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra import edge
from infra.aws.iam import allow
from infra.config import StackConfig

# A deleted secret's name stays taken this long; 7 days is the shortest recovery AWS allows.
RECOVERY_DAYS = 7


def listeners(
    name: str,
    cfg: StackConfig,
    alb: aws.lb.LoadBalancer,
    target: aws.lb.TargetGroup,
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> None:
    forward = [aws.lb.ListenerDefaultActionArgs(type="forward", target_group_arn=target.arn)]
    if cfg.tls is None:  # no certificate: a dev or VPC-internal stack (infra.edge.parse_tls)
        aws.lb.Listener(
            f"{name}-http",
            load_balancer_arn=alb.arn,
            port=edge.HTTP_PORT,
            protocol="HTTP",
            default_actions=forward,
            tags=tags,
            opts=opts,
        )
        return
    aws.lb.Listener(
        f"{name}-https",
        load_balancer_arn=alb.arn,
        port=edge.HTTPS_PORT,
        protocol="HTTPS",
        certificate_arn=cfg.tls.certificate,
        ssl_policy=cfg.tls.policy("aws"),
        default_actions=forward,
        tags=tags,
        opts=opts,
    )
    if cfg.tls.redirect_http:
        aws.lb.Listener(
            f"{name}-http",
            load_balancer_arn=alb.arn,
            port=edge.HTTP_PORT,
            protocol="HTTP",
            default_actions=[
                aws.lb.ListenerDefaultActionArgs(
                    type="redirect",
                    redirect=aws.lb.ListenerDefaultActionRedirectArgs(
                        protocol="HTTPS", port=str(edge.HTTPS_PORT), status_code="HTTP_301"
                    ),
                )
            ],
            tags=tags,
            opts=opts,
        )


def token_store(
    name: str,
    cfg: StackConfig,
    token: pulumi.Output[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> aws.secretsmanager.Secret:
    """The secret the nodes read their accepted tokens from (infra.edge.accepted)."""
    secret = aws.secretsmanager.Secret(
        f"{name}-api-token",
        name=edge.secret_name(cfg),
        description=f"torchfleet {cfg.stack}: the API tokens the nodes accept, one a line",
        recovery_window_in_days=RECOVERY_DAYS,
        tags=tags,
        opts=opts,
    )
    aws.secretsmanager.SecretVersion(
        f"{name}-api-token",
        secret_id=secret.id,
        secret_string=edge.accepted(cfg, token),
        opts=opts,
    )
    return secret


def read_policy(secret_arn: str) -> str:
    return allow("ReadTheStackApiTokens", ["secretsmanager:GetSecretValue"], [secret_arn])


def leave_policy(target_group_arn: str) -> str:
    """What a node needs to take itself out of the ALB before it drains (torchfleet_agent)."""
    return allow(
        "LeaveOwnTargetGroup", ["elasticloadbalancing:DeregisterTargets"], [target_group_arn]
    )
