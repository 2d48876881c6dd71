"""The monitoring host on AWS (infra.monitoring): a Debian 12 instance in the private services
subnet at the plan's fixed address, IMDSv2 only, an encrypted gp3 root, and an instance profile
that may call exactly the two EC2 Describe actions Prometheus' EC2 discovery needs and Cost
Explorer's GetCostAndUsage (the spend exporter), and read the journal receiver's certificate
secret (aws/edge.py's journal_store) and nothing else of Secrets Manager. The role
(playbooks/monitoring.yml) configures it from an operator's controller that reaches the VPC
(a VPN or bastion inside `admin_cidrs`); it runs no bootstrap of its own."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra import monitoring
from infra.aws import edge as aws_edge
from infra.aws import healing, imds
from infra.aws.iam import assume_role
from infra.aws.network import AwsNetwork
from infra.config import StackConfig
from infra.interface import MONITORING_ROLE_TAG, MonitoringHost
from infra.tags import with_name


def discovery_policy() -> str:
    """EC2 discovery's reads; `*` because EC2 scopes neither action to a resource."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "PrometheusEc2Discovery",
                    "Effect": "Allow",
                    "Action": list(monitoring.DISCOVERY_ACTIONS),
                    "Resource": "*",
                }
            ],
        }
    )


def spend_policy() -> str:
    """The spend exporter's read of Cost Explorer (roles/monitoring, infra.billing); `*` because
    Cost Explorer scopes GetCostAndUsage to no resource and no tag: the host can read the
    account's whole bill, and keeps the stack's lines only (its tag filter)."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "TorchfleetSpendExporter",
                    "Effect": "Allow",
                    "Action": list(monitoring.SPEND_ACTIONS["aws"]),
                    "Resource": "*",
                }
            ],
        }
    )


class AwsMonitoring(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        network: AwsNetwork,
        key: aws.ec2.KeyPair,
        image_id: pulumi.Input[str],
        arn_partition: str,
        journal: monitoring.JournalTls,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:aws:Monitoring", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        assert cfg.monitoring and network.monitoring_sg and network.services_subnet
        host = monitoring.host_name(cfg)
        host_tags = with_name(tags, host, **dict([MONITORING_ROLE_TAG]))
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=assume_role("ec2.amazonaws.com"),
            description=f"torchfleet {cfg.stack} monitoring host (EC2 discovery, spend)",
            tags=tags,
            opts=child,
        )
        aws.iam.RolePolicy(f"{name}-discovery", role=role.id, policy=discovery_policy(), opts=child)
        aws.iam.RolePolicy(f"{name}-spend", role=role.id, policy=spend_policy(), opts=child)
        # the journal receiver's certificate, key and CA (roles/monitoring reads them on the host)
        secret = aws_edge.journal_store(name, cfg, "receiver", journal.receiver, tags, child)
        aws.iam.RolePolicy(
            f"{name}-journal",
            role=role.id,
            policy=secret.apply(aws_edge.journal_read_policy),
            opts=child,
        )
        profile = aws.iam.InstanceProfile(f"{name}-profile", role=role.name, tags=tags, opts=child)
        instance = aws.ec2.Instance(
            f"{name}-host",
            ami=image_id,
            instance_type=cfg.monitoring.instance_type.name,
            subnet_id=network.services_subnet.id,
            private_ip=monitoring.address(cfg),
            associate_public_ip_address=False,
            vpc_security_group_ids=[network.monitoring_sg.id],
            iam_instance_profile=profile.name,
            key_name=key.key_name,
            # Prometheus runs on the host: hop limit 1 keeps the token off containers.
            metadata_options=aws.ec2.InstanceMetadataOptionsArgs(**imds.ENABLED),
            root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                volume_size=cfg.monitoring.disk_gb,
                volume_type="gp3",
                encrypted=True,
                delete_on_termination=True,
            ),
            tags=host_tags,
            volume_tags=host_tags,
            opts=child,
        )
        healing.register(
            f"{name}-host",
            cfg,
            "monitoring",
            instance,
            cfg.monitoring.instance_type,
            False,
            arn_partition,
            child,
            tags,
        )
        self.host = MonitoringHost(
            name=host, private_ip=instance.private_ip, login_user=monitoring.login_user(cfg)
        )
        self.register_outputs({"private_ip": instance.private_ip})
