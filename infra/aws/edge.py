"""The AWS edge of a stack: the ALB's listeners (HTTPS with an ELB TLS policy; HTTP only
redirecting, 301) and the API token in Secrets Manager, readable by the node role alone (IAM:
GetSecretValue on that secret and nothing else; the operator's own credentials are the only
other reader). The policies and ports are infra.edge's.
With the stack's `rollout` block, the listener forwards to two target groups by weight: the
stable one (the group's) and the candidate one (nodes the rollout moved there), optionally
sticky; without it, to the stable group alone, as before.
`rollout_metrics` is what a rollout reads its per-track figures by (the stack output
ROLLOUT_METRICS_OUTPUT): the ALB's CloudWatch dimensions, LoadBalancer (its ARN suffix) and, per
track, TargetGroup (each target group's ARN suffix).
With `tls: {certificate: generate}` (dev stacks), the HTTPS listener serves a certificate the
stack generates for the ALB's DNS name (infra.edge.generate_certificate), imported into ACM with
its CA as the chain; `listeners` returns the stack outputs that adds (the CA).
`journal_store`: one end's journal certificate, key and CA (infra.monitoring.journal_tls) in its
own secret, which `journal_read_policy` lets that end's role read and nothing else."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra import edge, monitoring
from infra.aws.iam import allow
from infra.config import StackConfig
from infra.constants import ALB_NAMESPACE

# A deleted secret's name stays taken this long; 7 days is the shortest recovery AWS allows.
RECOVERY_DAYS = 7


def listeners(
    name: str,
    cfg: StackConfig,
    alb: aws.lb.LoadBalancer,
    target: aws.lb.TargetGroup,
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
    candidate: aws.lb.TargetGroup | None = None,
) -> dict[str, pulumi.Output[str]]:
    """The listeners; returns the stack outputs they add ({CA_OUTPUT: PEM} where the
    stack generates its certificate, else none)."""
    forward = [_forward(cfg, target, candidate)]
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
        return {}
    certificate, outputs = edge.listener_certificate(
        name,
        cfg,
        opts,
        # ACM imports the generated certificate with its CA as the chain
        lambda made: (
            aws.acm.Certificate(
                f"{name}-generated",
                certificate_body=made.certificate,
                private_key=made.private_key,
                certificate_chain=made.ca,
                tags=tags,
                opts=opts,
            ).arn
        ),
        dns_names=alb.dns_name.apply(lambda d: [d]),
    )
    aws.lb.Listener(
        f"{name}-https",
        load_balancer_arn=alb.arn,
        port=edge.HTTPS_PORT,
        protocol="HTTPS",
        certificate_arn=certificate,
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
    return outputs


def _forward(
    cfg: StackConfig, target: aws.lb.TargetGroup, candidate: aws.lb.TargetGroup | None
) -> aws.lb.ListenerDefaultActionArgs:
    split = cfg.rollout
    if split is None or candidate is None:
        return aws.lb.ListenerDefaultActionArgs(type="forward", target_group_arn=target.arn)
    Group = aws.lb.ListenerDefaultActionForwardTargetGroupArgs
    return aws.lb.ListenerDefaultActionArgs(
        type="forward",
        forward=aws.lb.ListenerDefaultActionForwardArgs(
            target_groups=[
                Group(arn=target.arn, weight=100 - split.candidate_weight),
                Group(arn=candidate.arn, weight=split.candidate_weight),
            ],
            # A sticky client keeps the group it first reached (an A/B that holds per client).
            stickiness=aws.lb.ListenerDefaultActionForwardStickinessArgs(
                enabled=True, duration=split.sticky_s
            )
            if split.sticky_s
            else None,
        ),
    )


def rollout_metrics(
    alb: aws.lb.LoadBalancer,
    target: aws.lb.TargetGroup,
    candidate: aws.lb.TargetGroup | None,
) -> dict[str, object]:
    """The CloudWatch dimensions of each track's requests (infra/rollout/signals.py's
    CloudWatchSource): {namespace, load_balancer, target_groups: {stable, candidate}}; the
    candidate only while the stack has a `rollout` block (its target group exists)."""
    groups = {"stable": target.arn_suffix}
    if candidate is not None:
        groups["candidate"] = candidate.arn_suffix
    return {"namespace": ALB_NAMESPACE, "load_balancer": alb.arn_suffix, "target_groups": groups}


def _secret(
    name: str,
    cfg: StackConfig,
    what: str,
    secret_name: str,
    description: str,
    value: pulumi.Output[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> pulumi.Output[str]:
    """A secret holding `value`; returns its ARN once the value is stored, so a grant made from
    it, and every node that waits for the grants, waits for the value too: no node boots to an
    empty secret."""
    secret = aws.secretsmanager.Secret(
        f"{name}-{what}",
        name=secret_name,
        description=f"torchfleet {cfg.stack}: {description}",
        recovery_window_in_days=RECOVERY_DAYS,
        tags=tags,
        opts=opts,
    )
    version = aws.secretsmanager.SecretVersion(
        f"{name}-{what}", secret_id=secret.id, secret_string=value, opts=opts
    )
    return pulumi.Output.all(secret.arn, version.id).apply(lambda v: str(v[0]))


def token_store(
    name: str,
    cfg: StackConfig,
    token: pulumi.Output[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> pulumi.Output[str]:
    """The secret the nodes read their accepted tokens from (infra.edge.accepted): its ARN."""
    return _secret(
        name,
        cfg,
        "api-token",
        edge.secret_name(cfg),
        "the API tokens the nodes accept, one a line",
        edge.accepted(cfg, token),
        tags,
        opts,
    )


def node_tls_store(
    name: str,
    cfg: StackConfig,
    made: edge.Generated,
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> pulumi.Output[str]:
    """`tls.backend`: the nodes' certificate and key (infra.edge.node_certificate), in the
    secret the nodes read them from as they read the tokens."""
    return _secret(
        name,
        cfg,
        "node-tls",
        edge.node_tls_secret_name(cfg),
        "the certificate and key the nodes serve HTTPS with",
        edge.pem_document(made),
        tags,
        opts,
    )


def journal_store(
    name: str,
    cfg: StackConfig,
    end: str,
    made: edge.Generated,
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> pulumi.Output[str]:
    """One end of the journal's TLS (receiver: the monitoring host; node: every node): its
    certificate, key and the journal CA, in the secret only that end reads."""
    return _secret(
        name,
        cfg,
        f"journal-{end}",
        monitoring.journal_secret_name(cfg, end),
        f"the journal {end}'s certificate, key and CA",
        edge.pem_document(made, with_ca=True),
        tags,
        opts,
    )


def journal_read_policy(secret_arn: str) -> str:
    return allow("ReadTheJournalCertificate", ["secretsmanager:GetSecretValue"], [secret_arn])


def read_policy(secret_arn: str) -> str:
    return allow("ReadTheStackApiTokens", ["secretsmanager:GetSecretValue"], [secret_arn])


def node_tls_read_policy(secret_arn: str) -> str:
    return allow("ReadTheNodesCertificate", ["secretsmanager:GetSecretValue"], [secret_arn])


def leave_policy(target_group_arn: str) -> str:
    """What a node needs to take itself out of the ALB before it drains (torchfleet_agent)."""
    return allow(
        "LeaveOwnTargetGroup", ["elasticloadbalancing:DeregisterTargets"], [target_group_arn]
    )
