"""`mode: kubernetes` on Alibaba Cloud: an ACK Pro managed cluster with a GPU node pool, and the
runtime on it.

The cluster (ack.pro.small: the edition with an SLA and KMS encryption of Secrets): a KMS key
for Secrets, control-plane and audit logs, RRSA (service-account roles), and an API server on
the VPC only: this provider cannot restrict a public API endpoint to admin_cidrs (the API
server's CLB ACL is not exposed), so `pulumi up` and kubectl run from inside the VPC or over a
VPN/bastion from the admin networks. The patch release of the configured minor comes from ACK
itself (cs.get_kubernetes_version) at deploy time.

The nodes: a small pay-as-you-go system pool, and ONE GPU pool that mixes purchase options like
the group mode's ESS group: `spot.on_demand_base` pay-as-you-go nodes, spot above them with
SpotWithPriceLimit and a per-type cap from `StackConfig.spot_cap`, spot remedy (a replacement
is started on the reclaim notice) and on-demand compensation when spot is short. Encrypted ESSD
system disks, metadata in hardened (token) mode only, the GPU taint and labels the workload
selects. ACK installs the NVIDIA driver and its own GPU device plugin on GPU nodes (a second
plugin from NVIDIA's chart would double-register nvidia.com/gpu), runs the cluster autoscaler
as a managed component (cs.AutoscalingConfig + the pool's scaling_config), and
ack-node-problem-detector marks a spot node about to be released; the pool's spot remedy then
replaces it and ACK drains a node it removes. That chain is ACK's documented behaviour, not
something this repository could exercise without a cluster.

The model, with `kubernetes.model_prefix`: the OSS CSI driver (an ACK default add-on) mounts the
prefix read-only, authenticated through RRSA with a role limited to reading that prefix.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_alicloud as alicloud

from infra.alicloud.network import AlicloudNetwork
from infra.config import StackConfig
from infra.interface import NODE_ROLE_TAG
from infra.k8s import addons
from infra.k8s.pools import ScaledPool
from infra.k8s.workload import (
    GPU_TAINT,
    Placement,
    gpu_node_labels,
    model_volume,
    termination_grace_s,
)

CLUSTER_SPEC = "ack.pro.small"
POD_CIDR = "172.20.0.0/16"  # Flannel; outside every VPC range config.py allows (10.x, /16-/22)
SERVICE_CIDR = "172.21.0.0/20"
NODE_IMAGE = "AliyunLinux3"  # ACK installs the GPU driver and device plugin on it
SYSTEM_DISK_GB = 40
PUBLIC_BANDWIDTH_MBPS = 100  # nodes pull images through their own address, as the fleet does
LOG_COMPONENTS = ["apiserver", "kcm", "scheduler", "ccm", "controlplane-events"]
LOG_TTL_DAYS = {"dev": "14", "prod": "90"}
# node-lifecycle-controller and ack-node-problem-detector: what the pools' auto repair needs.
ADDONS = (
    "flannel",
    "csi-plugin",
    "csi-provisioner",
    "ack-node-problem-detector",
    "node-lifecycle-controller",
)
OSS_FUSE_SERVICE_ACCOUNT = "system:serviceaccount:ack-csi-fuse:csi-fuse-ossfs"
CREDENTIAL_MINUTES = 240  # the kubeconfig Pulumi uses: temporary, re-read on every deploy
LB_ANNOTATION = "service.beta.kubernetes.io/alibaba-cloud-loadbalancer-"


def ack_version(minor: str, opts: pulumi.InvokeOptions) -> pulumi.Output[str]:
    """The newest patch release ACK offers for `minor` (e.g. 1.35 -> 1.35.1-aliyun.1)."""
    found = alicloud.cs.get_kubernetes_version_output(
        cluster_type="ManagedKubernetes", profile="Default", opts=opts
    )

    def pick(metadatas: list[Any]) -> str:
        versions = [m.version for m in metadatas]
        ours = [v for v in versions if v.startswith(minor + ".")]
        if not ours:
            raise ValueError(
                f"torchfleet:kubernetes.version = {minor!r}: ACK offers no {minor} "
                f"release here; it offers {', '.join(sorted(versions)) or 'none'}"
            )

        def key(v: str) -> tuple[int, ...]:
            return tuple(int(p) for p in v.split("-")[0].split("."))

        return max(ours, key=key)

    return found.metadatas.apply(pick)


class AckCluster(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        network: AlicloudNetwork,
        opts: pulumi.ResourceOptions | None = None,
        invoke_opts: pulumi.InvokeOptions | None = None,
    ):
        super().__init__("torchfleet:alicloud:Cluster", name, None, opts)
        assert cfg.kubernetes
        self.cfg, self.tags, self.name = cfg, tags, name
        self.child = pulumi.ResourceOptions(parent=self)
        invoke = invoke_opts or pulumi.InvokeOptions()
        switches = [s.id for s in network.switches]
        self.cluster = self._managed_cluster(switches, invoke)
        common = self._pool_settings(switches)
        self.system_pool = self._system_pool(common)
        self.gpu_pool = self._gpu_pool(common)
        self._autoscaler()
        self.scaled_pools = [
            ScaledPool(
                "gpu",
                self.gpu_pool.scaling_group_id,
                cfg.nodes.min,
                cfg.nodes.max,
                cfg.nodes.desired,
            )
        ]
        self.clients_acl = self._clients_acl()
        credential = alicloud.cs.get_cluster_credential_output(
            cluster_id=self.cluster.id, temporary_duration_minutes=CREDENTIAL_MINUTES, opts=invoke
        )
        self.kubeconfig: pulumi.Output[str] = pulumi.Output.secret(
            credential.apply(lambda c: c.kube_config)
        )
        self.switch_id = network.switches[0].id
        self.register_outputs({"cluster_id": self.cluster.id})

    def _managed_cluster(
        self, switches: list[pulumi.Output[str]], invoke: pulumi.InvokeOptions
    ) -> alicloud.cs.ManagedKubernetes:
        """The ACK Pro cluster and the KMS key its Secrets are encrypted with."""
        cfg, tags, name, child = self.cfg, self.tags, self.name, self.child
        k = cfg.kubernetes
        assert k
        key = alicloud.kms.Key(
            f"{name}-secrets",
            description=f"torchfleet {cfg.stack}: ACK Secrets encryption",
            key_spec="Aliyun_AES_256",
            key_usage="ENCRYPT/DECRYPT",
            protection_level="SOFTWARE",
            automatic_rotation="Enabled",
            rotation_interval="365d",
            pending_window_in_days=30,
            tags=tags,
            opts=child,
        )
        return alicloud.cs.ManagedKubernetes(
            f"{name}-ack",
            name=cfg.name,
            cluster_spec=CLUSTER_SPEC,
            profile="Default",
            version=ack_version(k.version, invoke),
            vswitch_ids=switches,
            pod_cidr=POD_CIDR,
            service_cidr=SERVICE_CIDR,
            new_nat_gateway=False,
            slb_internet_enabled=False,
            encryption_provider_key=key.id,
            enable_rrsa=True,
            deletion_protection=cfg.env == "prod",
            control_plane_log_components=LOG_COMPONENTS,
            control_plane_log_ttl=LOG_TTL_DAYS[cfg.env],
            audit_log_config=alicloud.cs.ManagedKubernetesAuditLogConfigArgs(enabled=True),
            addons=[alicloud.cs.ManagedKubernetesAddonArgs(name=a) for a in ADDONS],
            tags=tags,
            opts=child,
        )

    def _pool_settings(self, switches: list[pulumi.Output[str]]) -> dict[str, Any]:
        """What both node pools take: the switches, the login key, encrypted ESSD system disks,
        metadata in token mode only, public bandwidth, auto repair."""
        cfg, tags, name, child = self.cfg, self.tags, self.name, self.child
        login = alicloud.ecs.EcsKeyPair(
            f"{name}-key",
            key_pair_name=f"{cfg.name}-nodes",
            public_key=cfg.ssh_public_key,
            tags=tags,
            opts=child,
        )
        return dict(
            cluster_id=self.cluster.id,
            vswitch_ids=switches,
            instance_charge_type="PostPaid",
            image_type=NODE_IMAGE,
            key_name=login.key_pair_name,
            system_disk_category="cloud_essd",
            system_disk_encrypted=True,
            instance_metadata_options=alicloud.cs.NodePoolInstanceMetadataOptionsArgs(
                http_tokens="required"
            ),
            internet_charge_type="PayByTraffic",
            internet_max_bandwidth_out=PUBLIC_BANDWIDTH_MBPS,
            management=alicloud.cs.NodePoolManagementArgs(
                enable=True, auto_repair=True, max_unavailable=1
            ),
        )

    def _system_pool(self, common: dict[str, Any]) -> alicloud.cs.NodePool:
        """The small pay-as-you-go pool the cluster services run on."""
        cfg, tags, name, child = self.cfg, self.tags, self.name, self.child
        k = cfg.kubernetes
        assert k
        return alicloud.cs.NodePool(
            f"{name}-system",
            node_pool_name=f"{cfg.name}-system",
            instance_types=[k.system.instance_type],
            desired_size=str(k.system.count),  # the provider's schema: a string
            system_disk_size=SYSTEM_DISK_GB,
            spot_strategy="NoSpot",
            labels=[
                alicloud.cs.NodePoolLabelArgs(key=key_, value=v)
                for key_, v in addons.SYSTEM_LABELS.items()
            ],
            tags=tags,
            **common,
            opts=child,
        )

    def _gpu_pool(self, common: dict[str, Any]) -> alicloud.cs.NodePool:
        """The GPU pool: pay-as-you-go base, spot above it with a cap per type (spot.enabled)."""
        cfg, name, child = self.cfg, self.name, self.child
        node_tags = {**self.tags, NODE_ROLE_TAG[0]: NODE_ROLE_TAG[1]}
        spot: dict[str, Any] = {"spot_strategy": "NoSpot"}
        if cfg.spot.enabled:
            spot = dict(
                spot_strategy="SpotWithPriceLimit",
                spot_price_limits=[
                    alicloud.cs.NodePoolSpotPriceLimitArgs(
                        instance_type=t.name, price_limit=f"{cfg.spot_cap(t):.3f}"
                    )
                    for t in cfg.instance_types
                ],
                on_demand_base_capacity=cfg.spot.on_demand_base,
                on_demand_percentage_above_base_capacity=0,
                spot_instance_pools=len(cfg.instance_types),
                spot_instance_remedy=True,
                compensate_with_on_demand=True,
            )
        return alicloud.cs.NodePool(
            f"{name}-gpu",
            node_pool_name=f"{cfg.name}-gpu",
            instance_types=[t.name for t in cfg.instance_types],
            system_disk_size=cfg.disk_gb,
            multi_az_policy="COST_OPTIMIZED",
            scaling_config=alicloud.cs.NodePoolScalingConfigArgs(
                enable=True, min_size=cfg.nodes.min, max_size=cfg.nodes.max, type="gpu"
            ),
            labels=[
                alicloud.cs.NodePoolLabelArgs(key=key_, value=v)
                for key_, v in gpu_node_labels().items()
            ],
            taints=[
                alicloud.cs.NodePoolTaintArgs(
                    key=GPU_TAINT[0], value=GPU_TAINT[1], effect=GPU_TAINT[2]
                )
            ],
            tags=node_tags,
            **spot,
            **common,
            opts=child,
        )

    def _autoscaler(self) -> None:
        """ACK's managed cluster autoscaler, over the GPU pool's scaling config."""
        name, child = self.name, self.child
        alicloud.cs.AutoscalingConfig(
            f"{name}-autoscaler",
            cluster_id=self.cluster.id,
            scaler_type="cluster-autoscaler",
            expander="least-waste",
            scale_up_from_zero=True,
            scale_down_enabled=True,
            unneeded_duration="10m",
            cool_down_duration="10m",
            scan_interval="30s",
            utilization_threshold="0.5",
            gpu_utilization_threshold="0.5",
            # The runtime's scratch emptyDirs hold nothing worth keeping a node for.
            skip_nodes_with_local_storage=False,
            skip_nodes_with_system_pods=True,
            max_graceful_termination_sec=termination_grace_s() + 30,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[self.gpu_pool])
            ),
        )

    def _clients_acl(self) -> alicloud.slb.Acl | None:
        """The load balancer's allow-list of client CIDRs (None: an intranet one)."""
        cfg, tags, name, child = self.cfg, self.tags, self.name, self.child
        if not cfg.client_cidrs:
            return None
        return alicloud.slb.Acl(
            f"{name}-clients",
            name=f"{cfg.name}-k8s-clients",
            entry_lists=[
                alicloud.slb.AclEntryListArgs(entry=c, comment="client") for c in cfg.client_cidrs
            ],
            tags=tags,
            opts=child,
        )

    def model_volume(self) -> tuple[str | None, list[dict[str, Any]]]:
        cfg = self.cfg
        assert cfg.kubernetes
        if not cfg.kubernetes.model_prefix or not cfg.model_bucket:
            return None, []
        prefix = cfg.kubernetes.model_prefix
        rrsa = self.cluster.rrsa_metadata
        trust = pulumi.Output.all(rrsa.ram_oidc_provider_arn, rrsa.rrsa_oidc_issuer_url).apply(
            lambda a: json.dumps(
                {
                    "Version": "1",
                    "Statement": [
                        {
                            "Action": "sts:AssumeRole",
                            "Effect": "Allow",
                            "Principal": {"Federated": [a[0]]},
                            "Condition": {
                                "StringEquals": {
                                    "oidc:aud": "sts.aliyuncs.com",
                                    "oidc:iss": a[1],
                                    "oidc:sub": OSS_FUSE_SERVICE_ACCOUNT,
                                }
                            },
                        }
                    ],
                }
            )
        )
        role = alicloud.ram.Role(
            f"{self.name}-model-reader",
            role_name=f"{cfg.name}-model-reader",
            assume_role_policy_document=trust,
            force=True,
            description=f"torchfleet {cfg.stack}: read the model prefix (OSS CSI, RRSA)",
            tags=self.tags,
            opts=self.child,
        )
        policy = alicloud.ram.Policy(
            f"{self.name}-model-reader",
            policy_name=f"{cfg.name}-model-reader",
            description="read the model prefix",
            force=True,
            tags=self.tags,
            policy_document=json.dumps(
                {
                    "Version": "1",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Action": ["oss:ListObjects"],
                            "Resource": [f"acs:oss:*:*:{cfg.model_bucket}"],
                            "Condition": {"StringLike": {"oss:Prefix": [f"{prefix}*"]}},
                        },
                        {
                            "Effect": "Allow",
                            "Action": ["oss:GetObject"],
                            "Resource": [f"acs:oss:*:*:{cfg.model_bucket}/{prefix}*"],
                        },
                    ],
                }
            ),
            opts=self.child,
        )
        alicloud.ram.RolePolicyAttachment(
            f"{self.name}-model-reader",
            policy_name=policy.policy_name,
            policy_type="Custom",
            role_name=role.role_name,
            opts=self.child,
        )
        pv_name = f"{cfg.name}-model"
        return pv_name, [
            model_volume(
                cfg,
                pv_name,
                {
                    "driver": "ossplugin.csi.alibabacloud.com",
                    "volumeHandle": pv_name,
                    "readOnly": True,
                    "volumeAttributes": {
                        "bucket": cfg.model_bucket,
                        "path": f"/{prefix}",
                        "url": f"oss-{cfg.region}-internal.aliyuncs.com",
                        "otherOpts": "-o ro -o allow_other -o uid=10001 -o gid=10001",
                        "authType": "rrsa",
                        "roleName": role.role_name,
                    },
                },
            )
        ]

    def placement(self, model_claim: str | None) -> Placement:
        cfg = self.cfg
        annotations: dict[str, Any] = {
            LB_ANNOTATION + "address-type": "internet" if cfg.client_cidrs else "intranet",
            LB_ANNOTATION + "instance-charge-type": "PayByCLCU",
        }
        if not cfg.client_cidrs:
            annotations[LB_ANNOTATION + "vswitch-id"] = self.switch_id
        if self.clients_acl is not None:
            annotations.update(
                {
                    LB_ANNOTATION + "acl-status": "on",
                    LB_ANNOTATION + "acl-id": self.clients_acl.id,
                    LB_ANNOTATION + "acl-type": "white",
                }
            )
        if cfg.tls:  # the CLB ends TLS (no 1.0/1.1); HTTP only redirects
            ports = ["https:443"] + (["http:80"] if cfg.tls.redirect_http else [])
            annotations.update(
                {
                    LB_ANNOTATION + "protocol-port": ",".join(ports),
                    LB_ANNOTATION + "cert-id": cfg.tls.certificate,
                    LB_ANNOTATION + "tls-cipher-policy": cfg.tls.policy("alicloud"),
                }
            )
            if cfg.tls.redirect_http:
                annotations[LB_ANNOTATION + "forward-port"] = "80:443"
        return Placement(
            gpu_node_labels=gpu_node_labels(),
            service_annotations=annotations,
            model_claim=model_claim,
        )

    def releases(self) -> list[addons.Release]:
        return [addons.prometheus(self.cfg), addons.prometheus_adapter(self.cfg)]

    def node_pools(self) -> list[pulumi.Resource]:
        return [self.system_pool, self.gpu_pool]

    def facts(self) -> dict[str, Any]:
        return {"name": self.cfg.name, "id": self.cluster.id, "version": self.cluster.version}
