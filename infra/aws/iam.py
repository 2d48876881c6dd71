"""IAM documents the AWS components share: who may assume a role, and the node's narrow grants
(read its stack's bundle prefix and the model bucket's MODEL_PREFIX; complete its own group's
lifecycle actions; publish metrics in the torchfleet namespace only). infra.grants lists every
grant of the stacks that names no resource, and why."""

from __future__ import annotations

import json

from infra.nodeboot import METRICS_NAMESPACE, MODEL_PREFIX

# Session Manager on the nodes: only with `access.ssm: true` (infra.grants.MANAGED).
SSM_MANAGED_POLICY = "AmazonSSMManagedInstanceCore"


def assume_role(service: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
            ],
        }
    )


def allow(sid: str, actions: list[str], resources: list[str]) -> str:
    """A policy of one Allow statement: `actions` on `resources` and nothing else."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Sid": sid, "Effect": "Allow", "Action": actions, "Resource": resources}
            ],
        }
    )


def bundle_read_policy(prefix_arn: str) -> str:
    """GetObject on `arn:...:<bucket>/bundles/<stack>/*` and nothing else of the bucket."""
    return allow("ReadTheStackBundle", ["s3:GetObject"], [prefix_arn])


def model_read_policy(arn_partition: str, bucket: str, prefix: str = MODEL_PREFIX) -> str:
    """Read (and list) the model bucket's `prefix` and nothing else of it: a group's nodes read
    MODEL_PREFIX (what `torchfleet rollout` places there, the group vars' s3:// sources), a
    cluster's model volume its kubernetes.model_prefix."""
    arn = f"arn:{arn_partition}:s3:::{bucket}"
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ListTheModelPrefix",
                    "Effect": "Allow",
                    "Action": ["s3:ListBucket"],
                    "Resource": [arn],
                    "Condition": {"StringLike": {"s3:prefix": [prefix + "*"]}},
                },
                {
                    "Sid": "ReadTheModelPrefix",
                    "Effect": "Allow",
                    "Action": ["s3:GetObject"],
                    "Resource": [f"{arn}/{prefix}*"],
                },
            ],
        }
    )


def group_arn(arn_partition: str, region: str, account: str, group: str) -> str:
    # The group's uuid is unknown before it exists; its name is fixed (infra.nodeboot).
    return (
        f"arn:{arn_partition}:autoscaling:{region}:{account}:autoScalingGroup:*:"
        f"autoScalingGroupName/{group}"
    )


def lifecycle_policy(*groups: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "OwnLifecycleActions",
                    "Effect": "Allow",
                    "Action": [
                        "autoscaling:CompleteLifecycleAction",
                        "autoscaling:RecordLifecycleActionHeartbeat",
                    ],
                    "Resource": list(groups),
                },
                # PutMetricData has no resource-level permission: the namespace condition scopes it.
                {
                    "Sid": "PublishLoadMetrics",
                    "Effect": "Allow",
                    "Action": ["cloudwatch:PutMetricData"],
                    "Resource": "*",
                    "Condition": {"StringEquals": {"cloudwatch:namespace": METRICS_NAMESPACE}},
                },
            ],
        }
    )
