"""`mode: kubernetes` on AWS: an EKS cluster with GPU managed node groups, and the runtime on it.

The cluster: a least-privilege cluster role (AmazonEKSClusterPolicy and the one KMS key it
encrypts Secrets with), the private endpoint on and the public one open only to admin_cidrs,
every control-plane log type in a log group with a retention, the STANDARD upgrade policy (no
silent extended-support fee) and API authentication (access entries, no aws-auth ConfigMap).

The nodes: a small on-demand system group (cluster services), and GPU managed node groups
(AL2023 NVIDIA AMI: driver and container toolkit included), one per capacity type as
infra/k8s/pools.py splits them, through launch templates with IMDSv2 only (hop limit 1: pods
cannot reach the instance role) and encrypted gp3 roots. The spot cap: managed node groups take
no spot max price (EKS refuses launch templates with instance market options), so config.py
allows only ratio 1.0 here, which is EC2's own cap (a spot instance never costs more than its
on-demand price); `StackConfig.spot_cap` prices the spot nodes in the plan and is exported per
type so the cap in force is visible.

Around it (infra/k8s/addons.py says why each): NVIDIA's device plugin, the cluster autoscaler
with an IRSA role limited by tag to this cluster's groups, the Node Termination Handler in IMDS
mode, Prometheus and its adapter for the HPA; and the model, when `kubernetes.model_prefix` is
set, from the model bucket through the Mountpoint for S3 CSI driver (an EKS add-on with its own
read-only IRSA role) as a read-only volume at /models.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.addressing import split_cidrs
from infra.aws import imds
from infra.aws.iam import SSM_MANAGED_POLICY, assume_role, model_read_policy
from infra.aws.network import AwsNetwork
from infra.config import StackConfig
from infra.grants import (
    AUTOSCALER_OWNED_TAG,
    AUTOSCALER_READ_ACTIONS,
    AUTOSCALER_WRITE_ACTIONS,
)
from infra.interface import NODE_ROLE_TAG
from infra.k8s import addons, pools
from infra.k8s.pools import ScaledPool
from infra.k8s.workload import GPU_TAINT, Placement, gpu_node_labels, model_volume
from infra.outputs import first, present
from infra.tags import with_name

GPU_AMI = "AL2023_x86_64_NVIDIA"  # EKS API Nodegroup amiType: AL2 GPU AMIs end with 1.32
SYSTEM_AMI = "AL2023_x86_64_STANDARD"
ROOT_DEVICE = "/dev/xvda"  # AL2023's root device
SYSTEM_DISK_GB = 50
LOG_TYPES = ["api", "audit", "authenticator", "controllerManager", "scheduler"]
LOG_RETENTION_DAYS = {"dev": 14, "prod": 90}
CLUSTER_POLICIES = ("AmazonEKSClusterPolicy",)
NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryPullOnly",
)  # and SSM_MANAGED_POLICY with access.ssm: true
S3_CSI_ADDON = "aws-mountpoint-s3-csi-driver"
S3_CSI_SERVICE_ACCOUNT = "kube-system:s3-csi-driver-sa"
AUTOSCALER_SERVICE_ACCOUNT = "kube-system:cluster-autoscaler"
TAINT_EFFECT = {"NoSchedule": "NO_SCHEDULE"}  # EKS API spelling of the Kubernetes effect


def kubeconfig(
    name: pulumi.Input[str], endpoint: pulumi.Input[str], ca: pulumi.Input[str], region: str
) -> pulumi.Output[str]:
    """A kubeconfig that gets short-lived tokens from `aws eks get-token` (the AWS CLI where
    Pulumi runs, with the same credentials): no long-lived secret in the state."""

    def render(args: list[str]) -> str:
        cluster, server, data = args
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": cluster,
                "clusters": [
                    {
                        "name": cluster,
                        "cluster": {"server": server, "certificate-authority-data": data},
                    }
                ],
                "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
                "users": [
                    {
                        "name": cluster,
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "aws",
                                "args": [
                                    "eks",
                                    "get-token",
                                    "--cluster-name",
                                    cluster,
                                    "--region",
                                    region,
                                    "--output",
                                    "json",
                                ],
                                "interactiveMode": "Never",
                            }
                        },
                    }
                ],
            }
        )

    return pulumi.Output.all(name, endpoint, ca).apply(render)


class EksCluster(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        network: AwsNetwork,
        arn_partition: str,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:aws:Cluster", name, None, opts)
        assert cfg.kubernetes
        self.cfg, self.tags, self.name, self.partition = cfg, tags, name, arn_partition
        self.child = pulumi.ResourceOptions(parent=self)
        self.cluster_name = cfg.name
        self.cluster = self._control_plane(network)
        self.oidc, self.issuer_host = self._oidc_provider()
        self._tag_lb_subnets(network)
        self.node_role, groups_opts = self._node_role()
        security = [self.cluster.vpc_config.cluster_security_group_id, network.node_sg.id]
        self.system_group = self._system_group(network, security, groups_opts)
        self.gpu_groups: dict[str, aws.eks.NodeGroup] = {}
        self.scaled_pools: list[ScaledPool] = []
        self._gpu_groups(network, security, groups_opts)
        self.autoscaler_role = self._irsa(
            "autoscaler", AUTOSCALER_SERVICE_ACCOUNT, self._autoscaler_policy()
        )
        self.kubeconfig = kubeconfig(
            self.cluster.name,
            self.cluster.endpoint,
            self.cluster.certificate_authority.apply(lambda c: present(c.data, "cluster CA")),
            cfg.region,
        )
        self.register_outputs({"cluster_name": self.cluster.name})

    def _control_plane(self, network: AwsNetwork) -> aws.eks.Cluster:
        """The cluster, its role (the managed policy and the KMS key it encrypts Secrets
        with) and its log group."""
        cfg, tags, name, child = self.cfg, self.tags, self.name, self.child
        assert cfg.kubernetes
        key = aws.kms.Key(
            f"{name}-secrets",
            description=f"torchfleet {cfg.stack}: EKS Secrets encryption",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            tags=tags,
            opts=child,
        )
        role = aws.iam.Role(
            f"{name}-cluster-role",
            assume_role_policy=assume_role("eks.amazonaws.com"),
            description=f"torchfleet {cfg.stack} EKS control plane",
            tags=tags,
            opts=child,
        )
        attachments = [
            aws.iam.RolePolicyAttachment(
                f"{name}-cluster-{p}", role=role.name, policy_arn=self._managed(p), opts=child
            )
            for p in CLUSTER_POLICIES
        ]
        kms_use = aws.iam.RolePolicy(
            f"{name}-cluster-kms",
            role=role.id,
            policy=key.arn.apply(
                lambda arn: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Effect": "Allow",
                                "Resource": [arn],
                                "Action": [
                                    "kms:Encrypt",
                                    "kms:Decrypt",
                                    "kms:DescribeKey",
                                    "kms:ListGrants",
                                    "kms:CreateGrant",
                                ],
                            }
                        ],
                    }
                )
            ),
            opts=child,
        )
        logs = aws.cloudwatch.LogGroup(
            f"{name}-logs",
            name=f"/aws/eks/{self.cluster_name}/cluster",
            retention_in_days=LOG_RETENTION_DAYS[cfg.env],
            tags=tags,
            opts=child,
        )

        public_v4, _ = split_cidrs(cfg.admin_cidrs)  # EKS takes IPv4 public-access CIDRs only
        return aws.eks.Cluster(
            f"{name}-eks",
            name=self.cluster_name,
            version=cfg.kubernetes.version,
            role_arn=role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=[s.id for s in network.subnets],
                endpoint_private_access=True,
                endpoint_public_access=bool(public_v4),
                public_access_cidrs=public_v4 or None,
            ),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=key.arn),
                resources=["secrets"],
            ),
            enabled_cluster_log_types=LOG_TYPES,
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API", bootstrap_cluster_creator_admin_permissions=True
            ),
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type="STANDARD"),
            tags=tags,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[*attachments, kms_use, logs])
            ),
        )

    def _oidc_provider(self) -> tuple[aws.iam.OpenIdConnectProvider, pulumi.Output[str]]:
        """The cluster's OIDC provider (service-account roles) and its issuer's host."""
        issuer = self.cluster.identities.apply(
            lambda ids: present(
                first(first(ids, "cluster identity").oidcs, "OIDC issuer").issuer, "issuer URL"
            )
        )
        oidc = aws.iam.OpenIdConnectProvider(
            f"{self.name}-oidc",
            url=issuer,
            client_id_lists=["sts.amazonaws.com"],
            tags=self.tags,
            opts=self.child,
        )
        return oidc, issuer.apply(lambda url: url.removeprefix("https://"))

    def _tag_lb_subnets(self, network: AwsNetwork) -> None:
        """Load balancers: the cloud provider puts internal ones in subnets tagged so."""
        for i, subnet in enumerate(network.subnets):
            role_tag = (
                "kubernetes.io/role/elb"
                if self.cfg.client_cidrs
                else "kubernetes.io/role/internal-elb"
            )
            aws.ec2.Tag(
                f"{self.name}-subnet-{i}-lb",
                resource_id=subnet.id,
                key=role_tag,
                value="1",
                opts=self.child,
            )

    def _node_role(self) -> tuple[aws.iam.Role, pulumi.ResourceOptions]:
        """The nodes' role (with its managed policies), and the options every node group
        takes: after that role's policies, and its size left to the autoscaler."""
        cfg, name, child = self.cfg, self.name, self.child
        node_role = aws.iam.Role(
            f"{name}-node-role",
            assume_role_policy=assume_role("ec2.amazonaws.com"),
            description=f"torchfleet {cfg.stack} EKS nodes",
            tags=self.tags,
            opts=child,
        )
        node_attachments = [
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{p}", role=node_role.name, policy_arn=self._managed(p), opts=child
            )
            for p in NODE_POLICIES + ((SSM_MANAGED_POLICY,) if cfg.ssm else ())
        ]
        return node_role, pulumi.ResourceOptions.merge(
            child,
            pulumi.ResourceOptions(
                depends_on=node_attachments,
                # The autoscaler and the schedules move the size; a deploy must not move it back.
                ignore_changes=["scalingConfig.desiredSize"],
            ),
        )

    def _system_group(
        self, network: AwsNetwork, security: list[Any], opts: pulumi.ResourceOptions
    ) -> aws.eks.NodeGroup:
        """The small on-demand group the cluster services run on."""
        cfg = self.cfg
        assert cfg.kubernetes
        system = cfg.kubernetes.system
        return aws.eks.NodeGroup(
            f"{self.name}-system",
            cluster_name=self.cluster.name,
            node_role_arn=self.node_role.arn,
            node_group_name_prefix=f"{cfg.name}-system-",
            subnet_ids=[s.id for s in network.subnets],
            ami_type=SYSTEM_AMI,
            capacity_type="ON_DEMAND",
            instance_types=[system.instance_type],
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=system.count, max_size=system.count, desired_size=system.count
            ),
            launch_template=self._template("system", SYSTEM_DISK_GB, security),
            labels=dict(addons.SYSTEM_LABELS),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            tags=self.tags,
            opts=opts,
        )

    def _gpu_groups(
        self, network: AwsNetwork, security: list[Any], opts: pulumi.ResourceOptions
    ) -> None:
        """The GPU groups, one per pool (infra/k8s/pools.py), into gpu_groups and
        scaled_pools."""
        cfg, name = self.cfg, self.name
        node_tags = with_name(self.tags, f"{cfg.name}-gpu", **dict([NODE_ROLE_TAG]))
        gpu_template = self._template("gpu", cfg.disk_gb, security, node_tags)
        for pool in pools.split(cfg):
            group = aws.eks.NodeGroup(
                f"{name}-{pool.name}",
                cluster_name=self.cluster.name,
                node_role_arn=self.node_role.arn,
                node_group_name_prefix=f"{cfg.name}-{pool.name}-",
                subnet_ids=[s.id for s in network.subnets],
                ami_type=GPU_AMI,
                capacity_type="SPOT" if pool.spot else "ON_DEMAND",
                instance_types=[t.name for t in cfg.instance_types],
                scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                    min_size=pool.min, max_size=pool.max, desired_size=pool.desired
                ),
                launch_template=gpu_template,
                labels={
                    **gpu_node_labels(),
                    "nvidia.com/gpu.present": "true",
                    "torchfleet-pool": pool.name,
                },
                taints=[
                    aws.eks.NodeGroupTaintArgs(
                        key=GPU_TAINT[0], value=GPU_TAINT[1], effect=TAINT_EFFECT[GPU_TAINT[2]]
                    )
                ],
                update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
                node_repair_config=aws.eks.NodeGroupNodeRepairConfigArgs(enabled=True),
                tags={**node_tags, "torchfleet-pool": pool.name},
                opts=opts,
            )
            self.gpu_groups[pool.name] = group
            asg = group.resources.apply(
                lambda rs: present(
                    first(first(rs, "node group resources").autoscaling_groups, "ASG").name,
                    "ASG name",
                )
            )
            self.scaled_pools.append(ScaledPool(pool.name, asg, pool.min, pool.max, pool.desired))

    def _managed(self, policy: str) -> str:
        return f"arn:{self.partition}:iam::aws:policy/{policy}"

    def _template(
        self, kind: str, disk_gb: int, security: list[Any], node_tags: dict[str, str] | None = None
    ) -> aws.eks.NodeGroupLaunchTemplateArgs:
        cfg, node_tags = self.cfg, node_tags or with_name(self.tags, f"{self.cfg.name}-{kind}")
        template = aws.ec2.LaunchTemplate(
            f"{self.name}-{kind}-lt",
            name_prefix=f"{cfg.name}-{kind}-",
            description=f"torchfleet {cfg.stack} EKS {kind} nodes",
            vpc_security_group_ids=security,
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                **imds.ENABLED, instance_metadata_tags="disabled"
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=ROOT_DEVICE,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=disk_gb,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            monitoring=aws.ec2.LaunchTemplateMonitoringArgs(enabled=True),
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=r, tags=node_tags)
                for r in ("instance", "volume", "network-interface")
            ],
            update_default_version=True,
            tags=self.tags,
            opts=self.child,
        )
        return aws.eks.NodeGroupLaunchTemplateArgs(
            id=template.id, version=template.latest_version.apply(str)
        )

    def _irsa(self, suffix: str, service_account: str, policy: pulumi.Input[str]) -> aws.iam.Role:
        """A role only `service_account` (namespace:name) of this cluster can assume."""
        trust = pulumi.Output.all(self.oidc.arn, self.issuer_host).apply(
            lambda a: json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Federated": a[0]},
                            "Action": "sts:AssumeRoleWithWebIdentity",
                            "Condition": {
                                "StringEquals": {
                                    f"{a[1]}:sub": f"system:serviceaccount:{service_account}",
                                    f"{a[1]}:aud": "sts.amazonaws.com",
                                }
                            },
                        }
                    ],
                }
            )
        )
        role = aws.iam.Role(
            f"{self.name}-{suffix}",
            assume_role_policy=trust,
            description=f"torchfleet {self.cfg.stack}: {service_account}",
            tags=self.tags,
            opts=self.child,
        )
        aws.iam.RolePolicy(f"{self.name}-{suffix}", role=role.id, policy=policy, opts=self.child)
        return role

    def _autoscaler_policy(self) -> str:
        # Describe* calls take no resource scoping in IAM; the calls that change capacity are
        # limited to the groups EKS tags as this cluster's.
        owned = AUTOSCALER_OWNED_TAG.format(cluster=self.cluster_name)  # infra.grants
        return json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Resource": ["*"],
                        "Action": list(AUTOSCALER_READ_ACTIONS),
                    },
                    {
                        "Effect": "Allow",
                        "Resource": ["*"],
                        "Action": list(AUTOSCALER_WRITE_ACTIONS),
                        "Condition": {"StringEquals": {owned: "owned"}},
                    },
                ],
            }
        )

    def model_volume(self) -> tuple[str | None, list[dict[str, Any]]]:
        """The model bucket prefix as a read-only volume, through the S3 CSI add-on."""
        cfg = self.cfg
        assert cfg.kubernetes
        if not cfg.kubernetes.model_prefix or not cfg.model_bucket:
            return None, []
        prefix = cfg.kubernetes.model_prefix
        role = self._irsa(
            "model-reader",
            S3_CSI_SERVICE_ACCOUNT,
            model_read_policy(self.partition, cfg.model_bucket, prefix),
        )
        aws.eks.Addon(
            f"{self.name}-s3-csi",
            cluster_name=self.cluster.name,
            addon_name=S3_CSI_ADDON,
            service_account_role_arn=role.arn,
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="OVERWRITE",
            tags=self.tags,
            opts=pulumi.ResourceOptions.merge(
                self.child, pulumi.ResourceOptions(depends_on=[self.system_group])
            ),
        )
        pv_name = f"{cfg.name}-model"
        return pv_name, [
            model_volume(
                cfg,
                pv_name,
                {
                    "driver": "s3.csi.aws.com",
                    "volumeHandle": pv_name,
                    "readOnly": True,
                    "volumeAttributes": {"bucketName": cfg.model_bucket},
                },
                mount_options=[
                    "read-only",
                    f"region {cfg.region}",
                    f"prefix {prefix}",
                    "allow-other",
                    "uid=10001",
                    "gid=10001",
                ],
            )
        ]

    def placement(self, model_claim: str | None) -> Placement:
        cfg = self.cfg
        lb = "service.beta.kubernetes.io/aws-load-balancer-"
        annotations = {lb + "type": "nlb"}
        if not cfg.client_cidrs:
            annotations[lb + "internal"] = "true"
        if cfg.tls:  # the NLB ends TLS on the Service's https port (an NLB has no redirects)
            annotations.update(
                {
                    lb + "ssl-cert": cfg.tls.certificate,
                    lb + "ssl-ports": "https",
                    lb + "ssl-negotiation-policy": cfg.tls.policy("aws"),
                    lb + "backend-protocol": "tcp",
                }
            )
        return Placement(
            gpu_node_labels=gpu_node_labels(),
            service_annotations=annotations,
            model_claim=model_claim,
        )

    def node_pools(self) -> list[pulumi.Resource]:
        return [self.system_group, *self.gpu_groups.values()]

    def facts(self) -> dict[str, Any]:
        assert self.cfg.kubernetes
        return {
            "name": self.cluster.name,
            "version": self.cfg.kubernetes.version,
            "endpoint": self.cluster.endpoint,
        }

    def releases(self) -> list[addons.Release]:
        cfg = self.cfg
        assert cfg.kubernetes
        return [
            addons.device_plugin(cfg),
            addons.node_termination_handler(cfg),
            addons.cluster_autoscaler(
                cfg, self.cluster.name, self.autoscaler_role.arn, f".*{cfg.name}-gpu-spot-.*"
            ),
            addons.prometheus(cfg),
            addons.prometheus_adapter(cfg),
        ]
