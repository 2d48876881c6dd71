"""GPU nodes on Alibaba Cloud: ECS spot instances with SpotWithPriceLimit and a computed cap
(PostPaid, encrypted ESSD, hardened metadata, RAM role, auto-release as the dev TTL), or an ESS
scaling group (per-type spot caps, on-demand base, spot remedy, on-demand compensation) behind
a CLB that health-checks /readyz, whose nodes join the CLB's VServer group (the listeners'
backends, each group's nodes at its own weight) through a lifecycle hook once ready, leave it
(weight 0) and drain before the group takes them (terminating hook, spot notice), are replaced
when the CLB finds them unhealthy, and scale on load (infra.alicloud.scaling). Under a
`rollout` block giving a share, a candidate ESS group of the same nodes on the candidate's
model sits in the same VServer group at the weight that gives the share (_candidate_group).
Every node carries the bootstrap user-data. The CLB's listeners and the API token's KMS secret
are infra.alicloud.edge's.

Rolling on a new bundle: ESS's instance refresh does not serve this group. pulumi_alicloud
4.0.0's ess.InstanceRefresh targets an image or a launch template only (no scaling
configuration), and the StartInstanceRefresh API serves groups with the priority policy only, not
COST_OPTIMIZED (the one that keeps an on-demand base under spot). So a new bundle creates a new
scaling configuration (named by the bundle, replacing the old one, active at once): every node
ESS starts from then on (scale-out, spot remedy, health replacement) runs the new bundle, and
`OldestScalingConfiguration` first in the removal policy retires old-bundle nodes first on
scale-in. Nodes already running keep their bundle until they leave. A rollout's promotion (a
new stable_model) replaces them itself, surge first (infra/rollout/refresh.py's EssRoll); after
a new bundle, replace them by moving the desired size up and back, or one by one (`ess`
RemoveInstances with the drain hook)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pulumi
import pulumi_alicloud as alicloud

from infra import edge, healing, images, monitoring
from infra.alicloud import edge as ali_edge
from infra.alicloud import scaling
from infra.alicloud.bundle_store import AlicloudBundleStore
from infra.alicloud.network import AlicloudNetwork
from infra.config import STABLE_BACKEND_WEIGHT, StackConfig
from infra.constants import ROLLOUT_METRICS_OUTPUT
from infra.interface import (
    NODE_ROLE_TAG,
    Deployment,
    discovery_tags,
    group_deployment,
    instances_deployment,
)
from infra.nodeboot import (
    CANDIDATE_TAG,
    MODEL_PREFIX,
    candidate_group_name,
    group_name,
    track_models,
    user_data,
)
from infra.schedule import iso_utc

# What a node may call on its own group (docs/contracts/node.md): find and complete its lifecycle
# action, keep it alive while it works.
ESS_NODE_ACTIONS = [
    "ess:CompleteLifecycleAction",
    "ess:RecordLifecycleActionHeartbeat",
    "ess:DescribeLifecycleHooks",
    "ess:DescribeLifecycleActions",
    "ess:DescribeScalingActivities",
    "ess:DescribeScalingInstances",
]

PUBLIC_BANDWIDTH_MBPS = 100  # pay-by-traffic egress for packages and wheels


def role_policy(service: str) -> str:
    return json.dumps(
        {
            "Version": "1",
            "Statement": [
                {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": [service]}}
            ],
        }
    )


def attach_policy(
    resource: str,
    policy_name: str,
    description: str,
    document: pulumi.Input[str],
    role_name: pulumi.Input[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> alicloud.ram.RolePolicyAttachment:
    """One custom RAM policy, attached to a role (the nodes' grants, the monitoring host's)."""
    policy = alicloud.ram.Policy(
        resource,
        policy_name=policy_name,
        description=description,
        policy_document=document,
        force=True,
        tags=tags,
        opts=opts,
    )
    return alicloud.ram.RolePolicyAttachment(
        resource,
        policy_name=policy.policy_name,
        policy_type="Custom",
        role_name=role_name,
        opts=opts,
    )


def _lifecycle_policy(cfg: StackConfig) -> Callable[[list[str]], str]:
    """The nodes' lifecycle grant over the stack's groups (the stable group and, during a
    rollout, the candidate group): each node completes its own group's actions."""

    def document(group_ids: list[str]) -> str:
        return json.dumps(
            {
                "Version": "1",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": ESS_NODE_ACTIONS,
                        "Resource": [
                            f"acs:ess:{cfg.region}:*:scalinggroup/{group_id}"
                            for group_id in group_ids
                        ],
                    },
                    # No DescribeScalingGroups: the user-data hands the agent its group id
                    # (docs/contracts/node.md, "What the user-data hands the node").
                    # CloudMonitor has no resource-level permission for custom metrics.
                    {"Effect": "Allow", "Action": ["cms:PutCustomMetric"], "Resource": ["*"]},
                ],
            }
        )

    return document


class AlicloudFleet(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        network: AlicloudNetwork,
        store: AlicloudBundleStore,
        image_id: pulumi.Input[str],
        expiry: datetime | None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:alicloud:Fleet", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.cfg, self.name, self.child, self.store = cfg, name, child, store
        self.network, self.models = network, track_models(cfg)
        self.candidate_group: alicloud.ess.ScalingGroup | None = None
        self.node_tags = {**tags, NODE_ROLE_TAG[0]: NODE_ROLE_TAG[1]}
        image = images.query("alicloud", cfg.image_distro)

        self.key = alicloud.ecs.EcsKeyPair(
            f"{name}-key",
            key_pair_name=f"{cfg.name}-key",
            public_key=cfg.ssh_public_key,
            tags=tags,
            opts=child,
        )
        self.role = self._node_role(tags)
        self.grants = self._node_grants()  # every node waits for them
        if cfg.mode == "instances":
            self.instances = self._instances(network, image_id, expiry)
            self.deployment = instances_deployment(cfg, self.instances, image.login_user)
        else:
            self.deployment = self._group_deployment(network, image_id, image.login_user)
        self.register_outputs({})

    def _node_role(self, tags: dict[str, str]) -> alicloud.ram.Role:
        """The RAM role the nodes run as (ECS assumes it for them)."""
        cfg = self.cfg
        return alicloud.ram.Role(
            f"{self.name}-node-role",
            role_name=f"{cfg.name}-node",
            assume_role_policy_document=role_policy("ecs.aliyuncs.com"),
            description=f"torchfleet {cfg.stack} GPU nodes",
            force=True,
            tags=tags,
            opts=self.child,
        )

    def _node_grants(self) -> list[pulumi.CustomResource]:
        """The node role's grants a node needs before it configures: its stack's bundle, the API
        token's secret (stored here: self.token) and, with model_bucket, the bucket's models."""
        cfg, name, child = self.cfg, self.name, self.child
        if cfg.model_bucket:
            self._grant("models", f"read the model bucket's {MODEL_PREFIX}", self._models_policy())
        # The bootstrap reads its stack's bundle prefix and nothing else of the bucket.
        grants = [
            self._grant(
                "bundle",
                "read this stack's node bundle",
                self.store.read_arn.apply(
                    lambda arn: json.dumps(
                        {
                            "Version": "1",
                            "Statement": [
                                {"Effect": "Allow", "Action": ["oss:GetObject"], "Resource": [arn]}
                            ],
                        }
                    )
                ),
            )
        ]
        # The token's secret and the grant to read it: a node reads it while it configures.
        self.token = edge.token(cfg, child)
        self.edge_outputs: dict[str, pulumi.Output[str]] = {}  # a generated CA (alicloud/edge.py)
        grants += [
            ali_edge.token_store(name, cfg, self.token, self.node_tags, child),
            self._grant("api-token", "read the stack's API tokens", ali_edge.read_policy(cfg)),
        ]
        # The journal's TLS (monitoring): the nodes' client certificate in their own secret;
        # the monitoring host stores and reads the receiver's (alicloud/monitoring.py).
        self.journal: monitoring.JournalTls | None = None
        if cfg.monitoring:
            self.journal = monitoring.journal_tls(name, cfg, child)
            secret = monitoring.journal_secret_name(cfg, "node")
            grants += [
                ali_edge.journal_store(name, cfg, "node", self.journal.node, self.node_tags, child),
                self._grant(
                    "journal",
                    "read the nodes' journal certificate",
                    ali_edge.secret_read_policy(cfg, secret),
                ),
            ]
        return grants

    def _models_policy(self) -> str:
        """Read the model bucket's models/ prefix: list it and get its objects."""
        bucket = self.cfg.model_bucket
        return json.dumps(
            {
                "Version": "1",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": ["oss:ListObjects"],
                        "Resource": [f"acs:oss:*:*:{bucket}"],
                        "Condition": {"StringLike": {"oss:Prefix": [MODEL_PREFIX + "*"]}},
                    },
                    {
                        "Effect": "Allow",
                        "Action": ["oss:GetObject"],
                        "Resource": [f"acs:oss:*:*:{bucket}/{MODEL_PREFIX}*"],
                    },
                ],
            }
        )

    def _group_deployment(
        self, network: AlicloudNetwork, image_id: pulumi.Input[str], login_user: str
    ) -> Deployment:
        """Group mode: the scaling group(s) behind the CLB, found by their tags, and with a
        rollout the figures its guards read."""
        cfg = self.cfg
        self.group, self.clb = self._group(network, image_id)
        deployment = group_deployment(
            cfg,
            self.clb.address,
            login_user,
            tags=discovery_tags(cfg),
            scaling_group_name=group_name(cfg),
        )
        if cfg.rollout is not None:
            deployment.extra_outputs[ROLLOUT_METRICS_OUTPUT] = self._rollout_metrics()
        return deployment

    def _rollout_metrics(self) -> dict[str, object]:
        """Where a rollout's guards read each track's figures without a Prometheus
        (infra/rollout/signals.py's CloudMonitorSource): the nodes' custom metrics in the stack's
        application group, by scaling group (one per track; the candidate's while it exists),
        and the CLB whose own figures cross-check them."""
        account = alicloud.get_account_output(opts=pulumi.InvokeOutputOptions(parent=self)).id
        groups = {"stable": self.group.id}
        if self.candidate_group is not None:
            groups["candidate"] = self.candidate_group.id
        return {
            "namespace": account.apply(lambda a: f"acs_customMetric_{a}"),
            "metric_group": self.metrics_group.id,
            "scaling_groups": groups,
            # the CLB's own figures, which the guard holds the nodes' against (no node writes
            # them: cms:PutCustomMetric cannot be scoped, docs/security.md)
            "load_balancer": self.clb.id,
        }

    def _grant(self, suffix: str, why: str, document: pulumi.Input[str]) -> pulumi.CustomResource:
        return attach_policy(
            f"{self.name}-node-{suffix}",
            f"{self.cfg.name}-{suffix}",
            why,
            document,
            self.role.role_name,
            self.node_tags,
            self.child,
        )

    def _spot_strategy(self) -> str:
        # market: instances mode buys on-demand after `up` fell back (infra.deploy.capacity)
        return "SpotWithPriceLimit" if self.cfg.market == "spot" else "NoSpot"

    def _instances(
        self, network: AlicloudNetwork, image_id: pulumi.Input[str], expiry: datetime | None
    ) -> list[alicloud.ecs.Instance]:
        cfg, name = self.cfg, self.name
        out = []
        for i in range(cfg.nodes.count):
            switch = network.switches[i % len(network.switches)]
            zone = cfg.zones[i % len(cfg.zones)]
            spot: dict[str, Any] = {}
            if cfg.market == "spot":
                spot = {
                    "spot_price_limit": cfg.spot_cap(cfg.instance_type),
                    "spot_interruption_behavior": cfg.spot.interruption.capitalize(),
                }
            out.append(
                alicloud.ecs.Instance(
                    f"{name}-node-{i}",
                    instance_name=f"{cfg.stack}-gpu-{i}",
                    host_name=f"{cfg.stack}-gpu-{i}",
                    availability_zone=zone,
                    vswitch_id=switch.id,
                    security_groups=[network.sg.id],
                    instance_type=cfg.instance_type.name,
                    image_id=image_id,
                    key_name=self.key.key_pair_name,
                    role_name=self.role.role_name,
                    # auto-release and spot both need pay-as-you-go
                    instance_charge_type="PostPaid",
                    spot_strategy=self._spot_strategy(),
                    **spot,
                    auto_release_time=iso_utc(expiry) if expiry else None,
                    # infra.healing: restarted on a healthy host after a host failure
                    maintenance_action=healing.AUTO_RECOVER,
                    system_disk_category="cloud_essd",
                    system_disk_size=cfg.disk_gb,
                    system_disk_encrypted=True,
                    internet_charge_type="PayByTraffic",
                    internet_max_bandwidth_out=PUBLIC_BANDWIDTH_MBPS,
                    http_endpoint="enabled",
                    http_tokens="required",
                    user_data=user_data(
                        cfg, self.store.bucket.bucket, mode=cfg.bootstrap_mode, group=False
                    ),
                    tags=self.node_tags,
                    volume_tags=self.node_tags,
                    opts=pulumi.ResourceOptions.merge(
                        self.child,
                        pulumi.ResourceOptions(
                            # cloud-init configures a node once per instance: ECS would apply new
                            # user-data in place (a reboot), leaving the node on its old bundle. A new
                            # bundle is a new instance instead.
                            replace_on_changes=["userData"],
                            depends_on=[self.store.object, *self.grants],
                        ),
                    ),
                )
            )
        return out

    def _group(
        self, network: AlicloudNetwork, image_id: pulumi.Input[str]
    ) -> tuple[alicloud.ess.ScalingGroup, alicloud.slb.ApplicationLoadBalancer]:
        cfg, name, child = self.cfg, self.name, self.child
        public = bool(cfg.client_cidrs)
        clb = alicloud.slb.ApplicationLoadBalancer(
            f"{name}-clb",
            load_balancer_name=f"{cfg.name}-clb",
            address_type="internet" if public else "intranet",
            vswitch_id=None if public else network.switches[0].id,
            load_balancer_spec="slb.s2.small",
            payment_type="PayAsYouGo",
            master_zone_id=cfg.zones[0],
            slave_zone_id=cfg.zones[1],
            tags=self.node_tags,
            opts=child,
        )
        acl_args: dict = {"acl_status": "off"}
        if public:
            acl = alicloud.slb.Acl(
                f"{name}-clients",
                name=f"{cfg.name}-clients",
                entry_lists=[
                    alicloud.slb.AclEntryListArgs(entry=c, comment="client")
                    for c in cfg.client_cidrs
                ],
                tags=self.node_tags,
                opts=child,
            )
            acl_args = {"acl_status": "on", "acl_type": "white", "acl_id": acl.id}
        # The VServer group the listeners forward to; each scaling group attaches its nodes to
        # it at its own weight (the rollout's split, _attach).
        self.backends = alicloud.slb.ServerGroup(
            f"{name}-backends",
            load_balancer_id=clb.id,
            name=f"{cfg.name}-backends",
            tags=self.node_tags,
            opts=child,
        )
        self.grants.append(
            self._grant(
                "leave",
                "leave the CLB before a drain",
                clb.id.apply(lambda lb: ali_edge.leave_policy(cfg, lb)),
            )
        )

        assert cfg.scaling is not None
        group = self._ess_group(
            f"{name}-group",
            group_name(cfg),
            (cfg.nodes.min, cfg.nodes.max, cfg.nodes.desired),
            self.node_tags,
            # Scaling rules and scheduled tasks move the desired size; a deploy must not move
            # it back.
            own_desired=True,
        )
        stable = self._attach(f"{name}-group", clb, group, STABLE_BACKEND_WEIGHT)
        # The listeners forward to the VServer group once it holds the stable nodes (a running
        # stack's move from the default server group: ESS adds its nodes on the attachment).
        self.edge_outputs = ali_edge.listeners(
            name,
            cfg,
            clb,
            self.backends,
            acl_args,
            pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[stable])),
        )
        metrics = alicloud.cms.MonitorGroup(
            f"{name}-metrics",
            monitor_group_name=f"{cfg.name}-metrics",
            tags=self.node_tags,
            opts=child,
        )
        self.metrics_group = metrics
        self.candidate_group = self._candidate_group(clb)
        groups = [group] + ([self.candidate_group] if self.candidate_group else [])
        self.grants.append(
            self._grant(
                "lifecycle",
                "complete own lifecycle actions, publish load metrics",
                pulumi.Output.all(*[g.id for g in groups]).apply(_lifecycle_policy(cfg)),
            )
        )
        hooks = scaling.lifecycle_hooks(name, cfg, group, child)
        self.rules = scaling.register(name, cfg, group, metrics, child)
        bundle = self.store.bundle

        # One configuration per bundle (see the module docstring on rolling), per track.
        def configure(
            track: str,
            grp: alicloud.ess.ScalingGroup,
            tags: dict[str, str],
            hooks_of_track: list[alicloud.ess.LifecycleHook],
            node_group: str | None = None,
        ) -> None:
            infix = "" if track == "stable" else f"-{track}"
            self._configuration(
                f"{name}{infix}-config",
                f"{cfg.name}{infix}-{bundle.sha256[:12]}",
                grp,
                image_id,
                network,
                user_data(
                    cfg,
                    self.store.bucket.bucket,
                    mode=cfg.bootstrap_mode,
                    group=True,
                    group_name_of_node=node_group,
                    extra=self._node_extra(grp, metrics, clb, track),
                ),
                tags,
                hooks_of_track,
            )

        configure("stable", group, self.node_tags, hooks)
        if self.candidate_group is not None:
            configure(
                "candidate",
                self.candidate_group,
                {**self.node_tags, CANDIDATE_TAG[0]: CANDIDATE_TAG[1]},
                scaling.lifecycle_hooks(f"{name}-candidate", cfg, self.candidate_group, child),
                candidate_group_name(cfg),
            )
        return group, clb

    def _node_extra(
        self,
        group: alicloud.ess.ScalingGroup,
        metrics: alicloud.cms.MonitorGroup,
        clb: alicloud.slb.ApplicationLoadBalancer,
        track: str,
    ) -> dict[str, pulumi.Input[Any]]:
        """The user-data's further fields of a group's nodes: their group and metric group, the
        CLB and VServer group they leave before a drain and, under a `rollout` block naming one,
        their track's model (infra.nodeboot.track_models: an object key and a digest, no
        credential; the node agent hands it to Ansible over the bundle's)."""
        model = self.models.get(track)
        return {
            "group_id": group.id,
            "metrics_group_id": metrics.id,
            "load_balancer_id": clb.id,
            "vserver_group_id": self.backends.id,
            **({"model": model} if model else {}),
        }

    def _ess_group(
        self,
        resource: str,
        scaling_group_name: str,
        size: tuple[int, int, int],
        node_tags: dict[str, str],
        own_desired: bool,
    ) -> alicloud.ess.ScalingGroup:
        """A scaling group of the stack's nodes: `size` (min, max, desired) over the stack's
        vSwitches, the CLB's health check, the spot settings and the removal policy; its nodes
        join the VServer group through _attach. `own_desired`: the desired size is the group's
        (scaling rules, schedules), not the plan's."""
        cfg, network = self.cfg, self.network
        low, high, desired = size
        return alicloud.ess.ScalingGroup(
            resource,
            scaling_group_name=scaling_group_name,
            min_size=low,
            max_size=high,
            desired_capacity=desired,
            vswitch_ids=[s.id for s in network.switches],
            # The CLB's /readyz check decides health: a node that stops being ready is
            # replaced (the ECS default only notices a stopped instance). A node joins the CLB
            # when it enters service, i.e. after its launch hook, so no grace period is needed.
            health_check_types=["LOAD_BALANCER"],
            # COST_OPTIMIZED is the policy that honours the on-demand base / percentage and
            # spot remedies; with vSwitches in two zones it still spreads over both.
            multi_az_policy="COST_OPTIMIZED",
            on_demand_base_capacity=cfg.spot.on_demand_base if cfg.spot.enabled else cfg.nodes.max,
            on_demand_percentage_above_base_capacity=(
                cfg.spot.on_demand_percentage if cfg.spot.enabled else 100
            ),
            spot_instance_pools=len(cfg.instance_types) if cfg.spot.enabled else None,
            spot_instance_remedy=cfg.spot.enabled,  # replace spot before it is reclaimed
            # on-demand when spot is short (spot.fallback: on_demand, the default)
            compensate_with_on_demand=cfg.spot.enabled and cfg.spot.fallback == "on_demand",
            # Old-bundle nodes go first (see the module docstring on rolling).
            removal_policies=["OldestScalingConfiguration", "OldestInstance"],
            default_cooldown=300,
            tags=node_tags,
            opts=pulumi.ResourceOptions.merge(
                self.child,
                pulumi.ResourceOptions(ignore_changes=["desiredCapacity"] if own_desired else None),
            ),
        )

    def _attach(
        self,
        resource: str,
        clb: alicloud.slb.ApplicationLoadBalancer,
        group: alicloud.ess.ScalingGroup,
        weight: int,
    ) -> alicloud.ess.ScalingGroupVServerGroups:
        """`group`'s nodes in the VServer group at the service port, each at `weight` (ESS adds
        the group's running nodes when attached, and each node it starts from then on; a new
        weight is a detach and a re-attach, so the stable group's never moves)."""
        return alicloud.ess.ScalingGroupVServerGroups(
            f"{resource}-backends",
            scaling_group_id=group.id,
            vserver_groups=[
                alicloud.ess.ScalingGroupVServerGroupsVserverGroupArgs(
                    loadbalancer_id=clb.id,
                    vserver_attributes=[
                        alicloud.ess.ScalingGroupVServerGroupsVserverGroupVserverAttributeArgs(
                            vserver_group_id=self.backends.id,
                            port=self.cfg.service_port,
                            weight=weight,
                        )
                    ],
                )
            ],
            opts=self.child,
        )

    def _candidate_group(
        self, clb: alicloud.slb.ApplicationLoadBalancer
    ) -> alicloud.ess.ScalingGroup | None:
        """The rollout's candidate group while the `rollout` block gives it a share and names its
        model (infra.nodeboot.track_models): the stable group's nodes (types, vSwitches, spot
        settings, hooks, scaling configuration shape) on the candidate's model, in the same
        VServer group at the weight that gives the share beside the stable group's minimum
        (RolloutSplit.candidate_size nodes at RolloutSplit.backend_weight, the stable ones at
        STABLE_BACKEND_WEIGHT). No scaling rules: the split declares its size."""
        cfg = self.cfg
        if cfg.rollout is None or not self.models.get("candidate"):
            return None
        n = cfg.rollout.candidate_size(cfg.nodes.min, cfg.nodes.max)
        group = self._ess_group(
            f"{self.name}-candidate-group",
            candidate_group_name(cfg),
            (n, n, n),
            {**self.node_tags, CANDIDATE_TAG[0]: CANDIDATE_TAG[1]},
            own_desired=False,
        )
        self._attach(
            f"{self.name}-candidate-group",
            clb,
            group,
            cfg.rollout.backend_weight(cfg.nodes.min, cfg.nodes.max),
        )
        return group

    def _configuration(
        self,
        resource: str,
        configuration_name: str,
        group: alicloud.ess.ScalingGroup,
        image_id: pulumi.Input[str],
        network: AlicloudNetwork,
        node_user_data: pulumi.Input[str],
        node_tags: dict[str, str],
        hooks: list[alicloud.ess.LifecycleHook],
    ) -> alicloud.ess.ScalingConfiguration:
        """The group's active scaling configuration: the hardened node (encrypted ESSD, the
        node role, spot caps per type) with `node_user_data`."""
        cfg = self.cfg
        spot_limits = None
        if cfg.spot.enabled:
            spot_limits = [
                alicloud.ess.ScalingConfigurationSpotPriceLimitArgs(
                    instance_type=t.name, price_limit=cfg.spot_cap(t)
                )
                for t in cfg.instance_types
            ]
        return alicloud.ess.ScalingConfiguration(
            resource,
            scaling_group_id=group.id,
            scaling_configuration_name=configuration_name,
            image_id=image_id,
            instance_types=[t.name for t in cfg.instance_types],
            instance_name=f"{cfg.stack}-gpu",
            security_group_ids=[network.sg.id],
            key_name=self.key.key_pair_name,
            role_name=self.role.role_name,
            spot_strategy=self._spot_strategy(),
            spot_price_limits=spot_limits,
            system_disk_category="cloud_essd",
            system_disk_size=cfg.disk_gb,
            system_disk_encrypted=True,
            internet_charge_type="PayByTraffic",
            internet_max_bandwidth_out=PUBLIC_BANDWIDTH_MBPS,
            http_endpoint="enabled",
            user_data=node_user_data,
            tags=node_tags,
            active=True,
            enable=True,
            force_delete=True,
            # This configuration enables the group: its first nodes need the bundle, the
            # grants and the hooks in place.
            opts=pulumi.ResourceOptions.merge(
                self.child,
                pulumi.ResourceOptions(
                    replace_on_changes=["userData", "imageId"],
                    depends_on=[self.store.object, *self.grants, *hooks],
                ),
            ),
        )
