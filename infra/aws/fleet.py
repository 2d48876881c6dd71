"""GPU nodes on AWS: a hardened launch template (IMDSv2 only, encrypted gp3 root, least-privilege
instance profile, spot with a price cap, the bootstrap user-data), then either plain instances
(dev) or an Auto Scaling group behind an ALB that health-checks /readyz (prod): nodes join only
once ready (launching hook), leave the target group and then drain (terminating hook, spot
notice), roll when the launch template changes (instance refresh) and scale on load
(infra.aws.scaling). The ALB's listeners and the API token's secret are infra.aws.edge's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import edge, images, monitoring
from infra.aws import edge as aws_edge
from infra.aws import fallback, healing, imds, scaling
from infra.aws.bundle_store import AwsBundleStore
from infra.aws.iam import (
    SSM_MANAGED_POLICY,
    assume_role,
    bundle_read_policy,
    group_arn,
    lifecycle_policy,
    model_read_policy,
)
from infra.aws.network import AwsNetwork
from infra.config import StackConfig
from infra.constants import HEALTH_PATH, ROLLOUT_METRICS_OUTPUT
from infra.interface import (
    NODE_ROLE_TAG,
    Deployment,
    discovery_tags,
    group_deployment,
    instances_deployment,
)
from infra.lifecycle import (
    COLD_BOOTSTRAP_BUDGET_S,
    DEREGISTRATION_DELAY_S,
    HEALTH_GRACE_S,
    INSTANCE_WARMUP_S,
    LB_HEALTH_INTERVAL_S,
    LB_HEALTH_TIMEOUT_S,
    LB_HEALTHY_THRESHOLD,
    LB_UNHEALTHY_THRESHOLD,
)
from infra.nodeboot import (
    CANDIDATE_TAG,
    candidate_group_name,
    fallback_group_name,
    group_name,
    track_models,
    user_data,
)
from infra.tags import with_name

# An instance refresh keeps at least this share of the desired nodes serving.
REFRESH_MIN_HEALTHY_PERCENT = 50


@dataclass(frozen=True)
class _NodeTemplate:
    """What every launch template of the fleet shares (the spot group's and its fallback's)."""

    image_id: pulumi.Input[str]
    key_name: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    profile_arn: pulumi.Input[str]
    node_tags: dict[str, str]
    tags: dict[str, str]
    opts: pulumi.ResourceOptions


class AwsFleet(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        network: AwsNetwork,
        store: AwsBundleStore,
        image_id: pulumi.Input[str],
        account: pulumi.Input[str],
        arn_partition: str,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:aws:Fleet", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.cfg, self.name, self.tags, self.child = cfg, name, tags, child
        node_tags = with_name(tags, f"{cfg.name}-node", **dict([NODE_ROLE_TAG]))
        image = images.query("aws", cfg.image_distro)
        self.key = aws.ec2.KeyPair(
            f"{name}-key",
            key_name_prefix=f"{cfg.name}-",
            public_key=cfg.ssh_public_key,
            tags=tags,
            opts=child,
        )
        profile = self._node_profile(network, store, account, arn_partition)
        # The bundle's sha256 is inside: a new bundle is a new template version (group) and a
        # new instance (instances mode, below).
        self.user_data = user_data(
            cfg,
            store.bucket.bucket,
            mode=cfg.bootstrap_mode,
            group=cfg.mode == "group",
            extra=self._node_extra(self.target, "stable"),
        )
        spot_instances = cfg.mode == "instances" and cfg.market == "spot"
        # Only a persistent request can be stopped (by a schedule) and restarted.
        self.persistent_spot = spot_instances and cfg.spot.interruption in ("stop", "hibernate")
        self._node = _NodeTemplate(
            image_id, self.key.key_name, network.node_sg.id, profile.arn, node_tags, tags, child
        )
        self.template = self.launch_template(f"{name}-lt", self.user_data, spot_instances)
        # A node fetches the bundle at boot: the object and the grants come first.
        needs = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[store.object, *self.grants])
        )
        self.fallback_group: aws.autoscaling.Group | None = None
        self.candidate_group: aws.autoscaling.Group | None = None
        if cfg.mode == "instances":
            self.instances = self._healed_instances(node_tags, network, needs, arn_partition)
            self.deployment = instances_deployment(cfg, self.instances, image.login_user)
        else:
            self.deployment = self._groups(node_tags, network, store, needs, image.login_user)
        self.register_outputs({"launch_template_id": self.template.id})

    def _node_profile(
        self,
        network: AwsNetwork,
        store: AwsBundleStore,
        account: pulumi.Input[str],
        arn_partition: str,
    ) -> aws.iam.InstanceProfile:
        """The nodes' instance profile: their role and its grants (self.grants, which every
        node waits for), with the API token's secret and, in group mode, the target groups
        the grants name."""
        cfg, name, tags, child = self.cfg, self.name, self.tags, self.child
        role = self._node_role(arn_partition)

        def grant(what: str, policy: pulumi.Input[str]) -> None:
            """One of the node role's policies; every node waits for all of them."""
            self.grants.append(
                aws.iam.RolePolicy(f"{name}-node-{what}", role=role.id, policy=policy, opts=child)
            )

        # What the bootstrap needs before anything runs: these grants exist before any node.
        self.grants: list[aws.iam.RolePolicy] = []
        grant("bundle", store.read_arn.apply(bundle_read_policy))
        self.token = edge.token(cfg, child)
        self.edge_outputs: dict[str, pulumi.Output[str]] = {}  # a generated CA (aws/edge.py)
        secret = aws_edge.token_store(name, cfg, self.token, tags, child)
        grant("api-token", secret.apply(aws_edge.read_policy))
        # tls.backend: the nodes' certificate, which Prometheus's scrape trusts (the inventory)
        self.node_certificate: pulumi.Output[str] | None = None
        if edge.backend_tls(cfg):
            made = edge.node_certificate(name, cfg, child)
            self.node_certificate = made.certificate
            node_tls = aws_edge.node_tls_store(name, cfg, made, tags, child)
            grant("node-tls", node_tls.apply(aws_edge.node_tls_read_policy))
        # The journal's TLS (monitoring): the nodes' client certificate in their own secret;
        # the monitoring host stores and reads the receiver's (aws/monitoring.py).
        self.journal: monitoring.JournalTls | None = None
        if cfg.monitoring:
            self.journal = monitoring.journal_tls(name, cfg, child)
            journal = aws_edge.journal_store(name, cfg, "node", self.journal.node, tags, child)
            grant("journal", journal.apply(aws_edge.journal_read_policy))
        self.target = (
            self._target_group(name, tags, network, child) if cfg.mode == "group" else None
        )
        # The rollout's candidate target group (the same checks) and, while the split gives it
        # a share and names its model, the candidate group's nodes in it (_candidate_group).
        self.candidate_target = (
            self._target_group(name, tags, network, child, "tg-candidate")
            if cfg.mode == "group" and cfg.rollout is not None
            else None
        )
        self.models = track_models(cfg)
        candidate_model = self.models.get("candidate")
        # each track's nodes may leave their own target group (the candidate's while it has some)
        if self.target is not None:
            grant("leave", self.target.arn.apply(aws_edge.leave_policy))
        if self.candidate_target is not None and candidate_model:
            grant("leave-candidate", self.candidate_target.arn.apply(aws_edge.leave_policy))
        if cfg.mode == "group":
            # the nodes of every group (infra.aws.fallback, the rollout's candidate group)
            # complete their own group's hooks
            groups = fallback.stable_groups(cfg) + (
                [candidate_group_name(cfg)] if candidate_model else []
            )
            arns = pulumi.Output.from_input(account).apply(
                lambda a: [group_arn(arn_partition, cfg.region, a, g) for g in groups]
            )
            grant("lifecycle", arns.apply(lambda arns: lifecycle_policy(*arns)))
        return aws.iam.InstanceProfile(f"{name}-node", role=role.name, tags=tags, opts=child)

    def _node_role(self, arn_partition: str) -> aws.iam.Role:
        """The nodes' role, with Session Manager's policy (access.ssm) and the model bucket's
        read policy where the stack has them."""
        cfg, name, child = self.cfg, self.name, self.child
        role = aws.iam.Role(
            f"{name}-node-role",
            assume_role_policy=assume_role("ec2.amazonaws.com"),
            description=f"torchfleet {cfg.stack} GPU nodes",
            tags=self.tags,
            opts=child,
        )
        # Session Manager (an SSH alternative that needs no open port) only where the stack
        # asks for it (access.ssm): it lets whoever holds ssm:StartSession or SendCommand on the
        # account run commands as root on every node (docs/security.md).
        if cfg.ssm:
            aws.iam.RolePolicyAttachment(
                f"{name}-node-ssm",
                role=role.name,
                policy_arn=f"arn:{arn_partition}:iam::aws:policy/{SSM_MANAGED_POLICY}",
                opts=child,
            )
        if cfg.model_bucket:
            aws.iam.RolePolicy(
                f"{name}-node-models",
                role=role.id,
                policy=model_read_policy(arn_partition, cfg.model_bucket),
                opts=child,
            )
        return role

    def _healed_instances(
        self,
        node_tags: dict[str, str],
        network: AwsNetwork,
        needs: pulumi.ResourceOptions,
        arn_partition: str,
    ) -> list[aws.ec2.Instance]:
        """Instances mode: the nodes, each with the self-healing its type allows."""
        cfg, name = self.cfg, self.name
        instances = self._instances(name, node_tags, network, needs)
        for i, inst in enumerate(instances):
            healing.register(
                f"{name}-node-{i}",
                cfg,
                f"gpu-{i}",
                inst,
                cfg.instance_type,
                cfg.market == "spot",
                arn_partition,
                self.child,
                self.tags,
            )
        return instances

    def _groups(
        self,
        node_tags: dict[str, str],
        network: AwsNetwork,
        store: AwsBundleStore,
        needs: pulumi.ResourceOptions,
        login_user: str,
    ) -> Deployment:
        """Group mode: the stable group behind the ALB and its scaling, the on-demand fallback
        group (infra.aws.fallback), the rollout's candidate group; what they export."""
        cfg, name, tags, child = self.cfg, self.name, self.tags, self.child
        self.group, alb, target = self._group(name, tags, node_tags, network, child, needs)
        self.policies = scaling.register(name, cfg, self.group, alb, target, child)
        if fallback.enabled(cfg):
            od_template = self.launch_template(
                f"{name}-od-lt",
                self._group_user_data(store, fallback_group_name(cfg), target, "stable"),
                spot=False,
            )
            self.fallback_group = fallback.register(
                name,
                cfg,
                self._mixed(od_template, on_demand_only=True),
                [s.id for s in network.subnets],
                target,
                node_tags,
                tags,
                child,
                needs,
            )
        self.candidate_group = self._candidate_group(name, store, network, node_tags, child, needs)
        deployment = group_deployment(
            cfg,
            alb.dns_name,
            login_user,
            # running by tag; `group_name` lets an inventory keep the InService ones (a node
            # still in its launch hook is running but bootstrapping itself)
            filters={
                **{f"tag:{k}": v for k, v in discovery_tags(cfg).items()},
                "instance-state-name": "running",
            },
            group_name=group_name(cfg),
            **({"fallback_group_name": fallback_group_name(cfg)} if fallback.enabled(cfg) else {}),
        )
        deployment.node_certificate = self.node_certificate
        deployment.extra_outputs[ROLLOUT_METRICS_OUTPUT] = aws_edge.rollout_metrics(
            alb, target, self.candidate_target
        )
        return deployment

    def _group_user_data(
        self, store: AwsBundleStore, group: str, target: aws.lb.TargetGroup, track: str
    ) -> pulumi.Output[str]:
        """The user-data of a sibling group's nodes (the on-demand fallback, the rollout's
        candidate): the stable group's, naming their own group and their track's model."""
        return user_data(
            self.cfg,
            store.bucket.bucket,
            mode=self.cfg.bootstrap_mode,
            group=True,
            group_name_of_node=group,
            extra=self._node_extra(target, track),
        )

    def _node_extra(
        self, target: aws.lb.TargetGroup | None, track: str
    ) -> dict[str, pulumi.Input[Any]] | None:
        """The user-data's further fields of a group's nodes: the target group they leave before
        a drain and, under a `rollout` block naming one, their track's model (the node agent
        hands it to Ansible over the bundle's; no credential, an object key and a digest)."""
        if target is None:
            return None
        model = self.models.get(track)
        return {"target_group_arn": target.arn, **({"model": model} if model else {})}

    def _candidate_group(
        self,
        name: str,
        store: AwsBundleStore,
        network: AwsNetwork,
        node_tags: dict[str, str],
        child: pulumi.ResourceOptions,
        needs: pulumi.ResourceOptions,
    ) -> aws.autoscaling.Group | None:
        """The rollout's candidate group while the `rollout` block gives it a share and a model
        (infra.nodeboot.track_models): the stable group's nodes (launch template family, types,
        subnets, spot settings, hooks) on the candidate's model, registered in the candidate
        target group only (the listener's weights give the share). Its size: as many nodes as
        the weight needs beside the stable group's minimum, at least one, at most nodes.max
        less that minimum (RolloutSplit.candidate_size, the kubernetes candidate's rule)."""
        cfg, target = self.cfg, self.candidate_target
        if cfg.rollout is None or target is None or not self.models.get("candidate"):
            return None
        n = cfg.rollout.candidate_size(cfg.nodes.min, cfg.nodes.max)
        template = self.launch_template(
            f"{name}-candidate-lt",
            self._group_user_data(store, candidate_group_name(cfg), target, "candidate"),
            spot=False,  # the group's mixed instances policy buys spot, as the stable group's
        )
        return scaling.sibling_group(
            f"{name}-candidate-asg",
            cfg,
            group=candidate_group_name(cfg),
            size=(n, n, n),
            mixed=self._mixed(template),
            subnet_ids=[s.id for s in network.subnets],
            target=target,
            node_tags={**node_tags, CANDIDATE_TAG[0]: CANDIDATE_TAG[1]},
            min_healthy=REFRESH_MIN_HEALTHY_PERCENT,
            child=child,
            needs=needs,
        )

    def launch_template(
        self, name: str, node_user_data: pulumi.Input[str], spot: bool
    ) -> aws.ec2.LaunchTemplate:
        """The hardened node template (IMDSv2 only, encrypted gp3 root, the node profile, the
        bootstrap user-data); `spot`: spot market options with the price cap."""
        cfg, node = self.cfg, self._node
        image = images.query("aws", cfg.image_distro)
        return aws.ec2.LaunchTemplate(
            name,
            image_id=node.image_id,
            key_name=node.key_name,
            vpc_security_group_ids=[node.security_group_id],
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=node.profile_arn),
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=node.node_tags)
                for kind in ("instance", "volume", "network-interface")
            ],
            tags=node.tags,
            opts=node.opts,
            name_prefix=f"{cfg.name}-",
            description=f"torchfleet {cfg.stack} GPU node",
            instance_type=cfg.instance_type.name,
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                **imds.ENABLED, instance_metadata_tags="enabled"
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=image.root_device,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=cfg.disk_gb,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            instance_market_options=self._spot_options() if spot else None,
            hibernation_options=(
                aws.ec2.LaunchTemplateHibernationOptionsArgs(configured=True)
                if spot and cfg.spot.interruption == "hibernate"
                else None
            ),
            monitoring=aws.ec2.LaunchTemplateMonitoringArgs(enabled=True),
            user_data=node_user_data,
            update_default_version=True,
        )

    def _spot_options(self) -> aws.ec2.LaunchTemplateInstanceMarketOptionsArgs:
        cfg = self.cfg
        persistent = self.persistent_spot
        return aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(
            market_type="spot",
            spot_options=aws.ec2.LaunchTemplateInstanceMarketOptionsSpotOptionsArgs(
                max_price=f"{cfg.spot_cap(cfg.instance_type):.4f}",
                spot_instance_type="persistent" if persistent else "one-time",
                instance_interruption_behavior=cfg.spot.interruption,
            ),
        )

    def _instances(
        self,
        name: str,
        node_tags: dict[str, str],
        network: AwsNetwork,
        child: pulumi.ResourceOptions,
    ) -> list[aws.ec2.Instance]:
        cfg = self.cfg
        out = []
        for i in range(cfg.nodes.count):
            subnet = network.subnets[i % len(network.subnets)]
            out.append(
                aws.ec2.Instance(
                    f"{name}-node-{i}",
                    launch_template=aws.ec2.InstanceLaunchTemplateArgs(
                        id=self.template.id, version=self.template.latest_version.apply(str)
                    ),
                    subnet_id=subnet.id,
                    # cloud-init configures a node once per instance: user-data changed in place
                    # (a stop/start by default) would leave it on its old bundle. The instance's own
                    # copy of the template's user-data makes a new bundle a new instance.
                    user_data_base64=self.user_data,
                    user_data_replace_on_change=True,
                    tags={**node_tags, "Name": f"{cfg.stack}-gpu-{i}"},
                    volume_tags={**node_tags, "Name": f"{cfg.stack}-gpu-{i}"},
                    opts=child,
                )
            )
        return out

    def _target_group(
        self,
        name: str,
        tags: dict[str, str],
        network: AwsNetwork,
        child: pulumi.ResourceOptions,
        suffix: str = "tg",
    ) -> aws.lb.TargetGroup:
        """Before the launch template: the nodes' user-data names it (they leave it first).
        `suffix` "tg-candidate": the rollout's candidate group, the same checks."""
        cfg = self.cfg
        # tls.backend: the ALB speaks HTTPS to the nodes, health checks included (it verifies
        # no certificate: infra.edge.node_certificate)
        protocol = "HTTPS" if edge.backend_tls(cfg) else "HTTP"
        return aws.lb.TargetGroup(
            f"{name}-{suffix}",
            port=cfg.service_port,
            protocol=protocol,
            vpc_id=network.vpc.id,
            target_type="instance",
            deregistration_delay=DEREGISTRATION_DELAY_S,
            health_check=aws.lb.TargetGroupHealthCheckArgs(
                enabled=True,
                path=HEALTH_PATH,
                matcher="200",
                protocol=protocol,
                port="traffic-port",
                interval=LB_HEALTH_INTERVAL_S,
                timeout=LB_HEALTH_TIMEOUT_S,
                healthy_threshold=LB_HEALTHY_THRESHOLD,
                unhealthy_threshold=LB_UNHEALTHY_THRESHOLD,
            ),
            tags=tags,
            opts=child,
        )

    def _group(
        self,
        name: str,
        tags: dict[str, str],
        node_tags: dict[str, str],
        network: AwsNetwork,
        child: pulumi.ResourceOptions,
        needs: pulumi.ResourceOptions,
    ) -> tuple[aws.autoscaling.Group, aws.lb.LoadBalancer, aws.lb.TargetGroup]:
        cfg = self.cfg
        assert network.lb_sg is not None and cfg.scaling is not None and self.target is not None
        subnet_ids = [s.id for s in network.subnets]
        target = self.target
        alb = aws.lb.LoadBalancer(
            f"{name}-alb",
            load_balancer_type="application",
            internal=not cfg.client_cidrs,
            security_groups=[network.lb_sg.id],
            subnets=subnet_ids,
            drop_invalid_header_fields=True,
            idle_timeout=60,
            tags=tags,
            opts=child,
        )
        self.edge_outputs = aws_edge.listeners(
            name, cfg, alb, target, tags, child, self.candidate_target
        )

        # A pinned version, not "$Latest": only a changed version number in the group's launch
        # template makes the provider start an instance refresh (a new bundle -> new user-data
        # -> new version -> rolling replacement). `triggers` would name further group arguments
        # (e.g. "tag"); the roll needs none.
        version = self.template.latest_version.apply(str)
        warm = cfg.warm_pool
        protect = cfg.scaling.protect_from_scale_in
        group = aws.autoscaling.Group(
            f"{name}-asg",
            name=group_name(cfg),  # fixed: the user-data and the node's grants name it
            min_size=cfg.nodes.min,
            max_size=cfg.nodes.max,
            desired_capacity=cfg.nodes.desired,
            vpc_zone_identifiers=subnet_ids,
            capacity_rebalance=cfg.spot.enabled,
            # the on-demand fallback's alarms read the group's own (free) size metrics
            enabled_metrics=list(fallback.GROUP_METRICS) if fallback.enabled(cfg) else None,
            metrics_granularity="1Minute" if fallback.enabled(cfg) else None,
            # The launching hook keeps a node out of service until /readyz is 200, so the grace
            # and the warm-up cover only the ALB's view and one metric period (infra.lifecycle).
            health_check_type="ELB",
            health_check_grace_period=HEALTH_GRACE_S,
            default_instance_warmup=INSTANCE_WARMUP_S,
            target_group_arns=[target.arn],
            protect_from_scale_in=protect,
            # Creation waits for min_size nodes to pass their launch hook: a broken bootstrap
            # fails `pulumi up` instead of looping quietly. A whole cold bootstrap, not the
            # hook's heartbeat timeout (infra.lifecycle.COLD_BOOTSTRAP_BUDGET_S).
            wait_for_capacity_timeout=f"{COLD_BOOTSTRAP_BUDGET_S + HEALTH_GRACE_S}s",
            # Hooks that exist before the first node launches (a separate LifecycleHook comes
            # after the group, too late for its first nodes); infra.aws.scaling keeps them
            # up to date afterwards.
            initial_lifecycle_hooks=[
                aws.autoscaling.GroupInitialLifecycleHookArgs(**hook) for hook in scaling.hooks(cfg)
            ],
            launch_template=(
                aws.autoscaling.GroupLaunchTemplateArgs(id=self.template.id, version=version)
                if warm
                else None
            ),
            mixed_instances_policy=None if warm else self._mixed(self.template),
            # Stopped, already-bootstrapped nodes: a scale-out starts one instead of launching
            # and converging a new one; scale-in returns nodes to the pool.
            warm_pool=aws.autoscaling.GroupWarmPoolArgs(
                pool_state="Stopped",
                min_size=warm.min_size,
                max_group_prepared_capacity=warm.max_prepared,
                instance_reuse_policy=aws.autoscaling.GroupWarmPoolInstanceReusePolicyArgs(
                    reuse_on_scale_in=True
                ),
            )
            if warm
            else None,
            instance_refresh=aws.autoscaling.GroupInstanceRefreshArgs(
                strategy="Rolling",
                preferences=aws.autoscaling.GroupInstanceRefreshPreferencesArgs(
                    min_healthy_percentage=REFRESH_MIN_HEALTHY_PERCENT,
                    instance_warmup=str(INSTANCE_WARMUP_S),
                    skip_matching=True,
                    # A bundle whose nodes never get ready rolls back, not the whole fleet down.
                    auto_rollback=True,
                    scale_in_protected_instances="Refresh" if protect else None,
                ),
            ),
            tags=[
                aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=True)
                for k, v in node_tags.items()
            ],
            # Scaling policies and schedules move the desired size; a deploy must not move it
            # back.
            opts=pulumi.ResourceOptions.merge(
                needs, pulumi.ResourceOptions(ignore_changes=["desiredCapacity"])
            ),
        )
        return group, alb, target

    def _mixed(
        self, template: aws.ec2.LaunchTemplate, on_demand_only: bool = False
    ) -> aws.autoscaling.GroupMixedInstancesPolicyArgs:
        """The group's instance types over `template`, split like the stack's spot settings
        (or, `on_demand_only`, all on-demand: the fallback group)."""
        cfg = self.cfg
        spot = cfg.spot.enabled and not on_demand_only
        # A pinned version, not "$Latest" (see _group on the instance refresh).
        version = template.latest_version.apply(str)
        # One cap for every type of the group: the lowest per-type cap, so no type is ever
        # bought above ratio x its own on-demand price (larger types then win only when cheap).
        cap = min(cfg.spot_cap(t) for t in cfg.instance_types)
        distribution = aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
            on_demand_base_capacity=cfg.spot.on_demand_base if spot else cfg.nodes.max,
            on_demand_percentage_above_base_capacity=(
                cfg.spot.on_demand_percentage if spot else 100
            ),
            spot_allocation_strategy="price-capacity-optimized",
            spot_max_price=f"{cap:.4f}" if spot else None,
        )
        return aws.autoscaling.GroupMixedInstancesPolicyArgs(
            launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                launch_template_specification=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                    launch_template_id=template.id, version=version
                ),
                overrides=[
                    aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(
                        instance_type=t.name
                    )
                    for t in cfg.instance_types
                ],
            ),
            instances_distribution=distribution,
        )
