"""The grants of the stacks' roles that name no resource, and the provider-managed policies a
role may carry: each with who holds it and why, in one place.

Contract. Every statement of every role policy a stack registers names that stack's own
resources (its groups, buckets and prefixes, secret, load balancer, instances), or its resource
is `*` and every action of it is a key of UNSCOPED: the cloud accepts no resource for that
action, and the statement carries exactly the entry's condition (None: the cloud offers no
condition key that would narrow it either). A role attaches a provider-managed policy only if
MANAGED names it, and then only where its `when` says. tests/infra/test_policy.py holds every
registered policy of the six example stacks to these tables (and fails on an entry no stack
uses); docs/security.md shows them (`markdown()`; `python -m infra.grants` prints it, and a test
compares the page with it). The references for "no resource-level permission" are the clouds'
own authorization tables, cited in docs/security.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from infra.nodeboot import METRICS_NAMESPACE

# The condition key the EKS cluster autoscaler's capacity calls are narrowed by: the groups EKS
# tags as this cluster's (`{cluster}`: the stack's physical name prefix, infra.config .name).
AUTOSCALER_OWNED_TAG = "aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster}"
# What the EKS cluster autoscaler's role may do (infra/aws/cluster.py grants exactly these).
AUTOSCALER_READ_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "autoscaling:DescribeTags",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
    "eks:DescribeNodegroup",
)
AUTOSCALER_WRITE_ACTIONS = (
    "autoscaling:SetDesiredCapacity",
    "autoscaling:TerminateInstanceInAutoScalingGroup",
)


@dataclass(frozen=True)
class Unscoped:
    """An action granted on `*`: its cloud, the condition the statement must carry (None: none
    exists for it), who holds it, and why no resource can be named."""

    cloud: str
    condition: dict[str, Any] | None
    who: str
    why: str

    def condition_for(self, cluster: str) -> dict[str, Any] | None:
        """The condition with the stack's names filled in (`{cluster}`)."""
        if self.condition is None:
            return None
        return json.loads(json.dumps(self.condition).replace("{cluster}", cluster))


_NO_RESOURCE = "the action has no resource-level permission"
_AUTOSCALER_READ = Unscoped(
    "aws",
    None,
    "the EKS cluster autoscaler (IRSA)",
    f"{_NO_RESOURCE} and no condition key; read-only discovery of the node groups",
)
_AUTOSCALER_WRITE = Unscoped(
    "aws",
    {"StringEquals": {AUTOSCALER_OWNED_TAG: "owned"}},
    "the EKS cluster autoscaler (IRSA)",
    f"{_NO_RESOURCE} before the group exists; the tag condition keeps it to the groups EKS tags "
    "as this cluster's",
)

UNSCOPED: dict[str, Unscoped] = {
    "cloudwatch:PutMetricData": Unscoped(
        "aws",
        {"StringEquals": {"cloudwatch:namespace": METRICS_NAMESPACE}},
        "GPU nodes (group mode)",
        f"{_NO_RESOURCE}; the namespace condition keeps a node to the torchfleet namespace (not "
        "to its own group's dimension), so the node-published scaling policies track the Minimum "
        "over the nodes and the rollout guard reads only the ALB's own metrics",
    ),
    "cms:PutCustomMetric": Unscoped(
        "alicloud",
        None,
        "GPU nodes (group mode)",
        "CloudMonitor grants by action only: no resource, no condition key (docs/security.md, "
        "Forged signals): any node can write any custom metric of the account",
    ),
    "ec2:DescribeInstances": Unscoped(
        "aws",
        None,
        "the monitoring host (Prometheus EC2 discovery)",
        f"{_NO_RESOURCE}; read-only, the host keeps the stack's tags",
    ),
    "ec2:DescribeAvailabilityZones": Unscoped(
        "aws", None, "the monitoring host (Prometheus EC2 discovery)", f"{_NO_RESOURCE}; read-only"
    ),
    "ce:GetCostAndUsage": Unscoped(
        "aws",
        None,
        "the monitoring host (spend exporter)",
        "Cost Explorer scopes to no resource or tag: the host reads the account's bill and sums "
        "the stack's lines",
    ),
    "ecs:DescribeInstances": Unscoped(
        "alicloud",
        None,
        "the monitoring host (group stacks: ECS discovery); the dev schedule's OOS role",
        "a region-wide describe that RAM scopes to no resource; read-only, filtered by the "
        "stack's tags",
    ),
    "bssapi:DescribeInstanceBill": Unscoped(
        "alicloud",
        None,
        "the monitoring host (spend exporter)",
        "BSS scopes the bill to no resource: the host reads the account's bill and sums the "
        "stack's lines",
    ),
    **{action: _AUTOSCALER_READ for action in AUTOSCALER_READ_ACTIONS},
    **{action: _AUTOSCALER_WRITE for action in AUTOSCALER_WRITE_ACTIONS},
}


@dataclass(frozen=True)
class Managed:
    """A provider-managed policy a role may attach: which roles, when, and why."""

    who: str
    when: str  # "always" or the stack key that asks for it
    why: str


SSM = "AmazonSSMManagedInstanceCore"

MANAGED: dict[str, Managed] = {
    SSM: Managed(
        "GPU nodes, EKS nodes; the image bake's build instance",
        "access.ssm: true (the bake: always)",
        "Session Manager shells and Run Command on the nodes for whoever holds ssm:StartSession "
        "or ssm:SendCommand in the account; EC2 Image Builder drives its build instance through "
        "Systems Manager",
    ),
    "EC2InstanceProfileForImageBuilder": Managed(
        "the image bake's build instance", "always", "EC2 Image Builder's own instance grants"
    ),
    "AmazonEKSClusterPolicy": Managed(
        "the EKS control plane", "always", "what EKS needs to run the cluster"
    ),
    "AmazonEKSWorkerNodePolicy": Managed("EKS nodes", "always", "a node joins the cluster"),
    "AmazonEKS_CNI_Policy": Managed(
        "EKS nodes", "always", "the VPC CNI assigns pod addresses from the VPC"
    ),
    "AmazonEC2ContainerRegistryPullOnly": Managed(
        "EKS nodes", "always", "pull the add-ons' and the runtime's images"
    ),
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """docs/security.md's two tables (between its grants-table markers)."""
    rows = [
        "| Action on `*` | Cloud | Condition | Who | Why |",
        "|---|---|---|---|---|",
    ]
    for action, u in UNSCOPED.items():
        cond = f"`{json.dumps(u.condition)}`" if u.condition else "none exists"
        rows.append(
            "| " + " | ".join(_cell(c) for c in (f"`{action}`", u.cloud, cond, u.who, u.why)) + " |"
        )
    rows += ["", "| Managed policy (AWS) | Who | When | Why |", "|---|---|---|---|"]
    for name, m in MANAGED.items():
        rows.append("| " + " | ".join(_cell(c) for c in (f"`{name}`", m.who, m.when, m.why)) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
