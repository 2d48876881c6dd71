"""The baked image on AWS (`boot: bake`): EC2 Image Builder converges a builder instance with the
same bundle and roles during `pulumi up` and captures an AMI; the group launches that AMI and its
nodes bootstrap in mode "baked" (check pins, fetch the model, warm up).

How the build runs: the recipe's user-data is the nodes' own cloud-init document in mode "bake"
with `poweroff=False` (Image Builder stops the instance and takes the image itself); the recipe's
one component waits for the bootstrap's status file and fails the build with the failing task
and the journal tail when the bake failed. Image Builder resources are immutable per version, so
each bundle gets its own component and recipe (named by the bundle's sha256), and a new bundle
means a new AMI, a new launch template version and an instance refresh.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra import images
from infra.aws import imds
from infra.aws.bundle_store import AwsBundleStore
from infra.aws.iam import SSM_MANAGED_POLICY, assume_role, bundle_read_policy
from infra.aws.network import AwsNetwork
from infra.config import StackConfig
from infra.lifecycle import COLD_BOOTSTRAP_BUDGET_S
from infra.nodeboot import user_data
from infra.outputs import first, present

STATUS_FILE = "/var/lib/torchfleet/bootstrap.json"
BOOTSTRAP_UNIT = "torchfleet-bootstrap.service"
POLL_S = 15
# The bake is a whole cold converge on a GPU builder (not a heartbeat gap).
BAKE_TIMEOUT_S = COLD_BOOTSTRAP_BUDGET_S


def wait_component(timeout_s: int) -> str:
    """Image Builder component document: wait for the bake to finish, fail loudly if it failed."""
    script = f"""set -eu
deadline=$(( $(date +%s) + {timeout_s} ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  if [ -f {STATUS_FILE} ]; then
    state=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("state"))' {STATUS_FILE})
    case "$state" in
      ready) echo "torchfleet bake finished"; cat {STATUS_FILE}; exit 0 ;;
      failed) echo "torchfleet bake FAILED"; cat {STATUS_FILE}
              journalctl -u {BOOTSTRAP_UNIT} --no-pager | tail -n 80; exit 1 ;;
    esac
  fi
  sleep {POLL_S}
done
echo "torchfleet bake did not finish within {timeout_s} s"; journalctl -u {BOOTSTRAP_UNIT} --no-pager | tail -n 80
exit 1
"""
    body = "\n".join("              " + line for line in script.splitlines())
    return f"""name: torchfleet-bake-wait
description: Wait for the torchfleet bootstrap (mode bake) that the recipe's user-data started.
schemaVersion: 1.0
phases:
  - name: build
    steps:
      - name: WaitForBake
        action: ExecuteBash
        timeoutSeconds: {timeout_s + 60}
        inputs:
          commands:
            - |
{body}
"""


class AwsBake(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        network: AwsNetwork,
        store: AwsBundleStore,
        parent_image: pulumi.Input[str],
        arn_partition: str,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:aws:Bake", name, None, opts)
        self.cfg, self.tags, self.name = cfg, tags, name
        self.child = pulumi.ResourceOptions(parent=self)
        profile = self._builder_profile(store, arn_partition)
        recipe = self._recipe(store, parent_image)
        infrastructure = self._infrastructure(network, profile)
        image = self._image(recipe, infrastructure)
        self.image_id: pulumi.Output[str] = image.output_resources.apply(
            lambda res: present(first(first(res, "image output").amis, "AMI").image, "AMI id")
        )
        self.register_outputs({"image_id": self.image_id})

    def _builder_profile(
        self, store: AwsBundleStore, arn_partition: str
    ) -> aws.iam.InstanceProfile:
        """The build instance's role: Image Builder's and Systems Manager's managed policies,
        and reading the stack's bundle."""
        cfg, tags, name, child = self.cfg, self.tags, self.name, self.child
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=assume_role("ec2.amazonaws.com"),
            description=f"torchfleet {cfg.stack} image builder instance",
            tags=tags,
            opts=child,
        )
        for suffix, policy in (
            ("builder", "EC2InstanceProfileForImageBuilder"),
            # Image Builder runs its components on the build instance through Systems Manager:
            # the instance needs the agent's grant whatever access.ssm says (infra.grants).
            ("ssm", SSM_MANAGED_POLICY),
        ):
            aws.iam.RolePolicyAttachment(
                f"{name}-{suffix}",
                role=role.name,
                policy_arn=f"arn:{arn_partition}:iam::aws:policy/{policy}",
                opts=child,
            )
        aws.iam.RolePolicy(
            f"{name}-bundle",
            role=role.id,
            policy=store.read_arn.apply(bundle_read_policy),
            opts=child,
        )
        return aws.iam.InstanceProfile(f"{name}-profile", role=role.name, tags=tags, opts=child)

    def _recipe(
        self, store: AwsBundleStore, parent_image: pulumi.Input[str]
    ) -> aws.imagebuilder.ImageRecipe:
        """The parent image, an encrypted root, the bake's user-data, and the component that
        waits for the bake to finish."""
        cfg, tags, name, child = self.cfg, self.tags, self.name, self.child
        sha = store.bundle.sha256[:12]
        component = aws.imagebuilder.Component(
            f"{name}-wait",
            name=f"{cfg.name}-bake-wait-{sha}",
            platform="Linux",
            version="1.0.0",
            data=wait_component(BAKE_TIMEOUT_S),
            description="wait for the torchfleet bake",
            tags=tags,
            opts=child,
        )
        root = images.query("aws", cfg.image_distro).root_device
        return aws.imagebuilder.ImageRecipe(
            f"{name}-recipe",
            name=f"{cfg.name}-{sha}",
            version="1.0.0",
            parent_image=parent_image,
            components=[aws.imagebuilder.ImageRecipeComponentArgs(component_arn=component.arn)],
            block_device_mappings=[
                aws.imagebuilder.ImageRecipeBlockDeviceMappingArgs(
                    device_name=root,
                    ebs=aws.imagebuilder.ImageRecipeBlockDeviceMappingEbsArgs(
                        volume_size=cfg.disk_gb,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            user_data_base64=user_data(
                cfg, store.bucket.bucket, mode="bake", group=False, extra={"poweroff": False}
            ),
            ami_tags={**tags, "torchfleet-bundle": store.bundle.sha256},
            tags=tags,
            opts=child,
        )

    def _infrastructure(
        self, network: AwsNetwork, profile: aws.iam.InstanceProfile
    ) -> aws.imagebuilder.InfrastructureConfiguration:
        cfg, tags, name, child = self.cfg, self.tags, self.name, self.child
        return aws.imagebuilder.InfrastructureConfiguration(
            f"{name}-infra",
            name=f"{cfg.name}-bake",
            instance_profile_name=profile.name,
            # The fleet's own type: the roles' GPU-only steps run where a GPU is.
            instance_types=[cfg.instance_type.name],
            subnet_id=network.subnets[0].id,
            security_group_ids=[network.node_sg.id],
            terminate_instance_on_failure=True,
            instance_metadata_options=aws.imagebuilder.InfrastructureConfigurationInstanceMetadataOptionsArgs(
                **imds.IMDSV2
            ),
            resource_tags=tags,
            tags=tags,
            opts=child,
        )

    def _image(
        self,
        recipe: aws.imagebuilder.ImageRecipe,
        infrastructure: aws.imagebuilder.InfrastructureConfiguration,
    ) -> aws.imagebuilder.Image:
        tags, name, child = self.tags, self.name, self.child
        return aws.imagebuilder.Image(
            f"{name}-image",
            image_recipe_arn=recipe.arn,
            infrastructure_configuration_arn=infrastructure.arn,
            # The wait component is the test: it fails the build when the bake failed.
            image_tests_configuration=aws.imagebuilder.ImageImageTestsConfigurationArgs(
                image_tests_enabled=False
            ),
            tags=tags,
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(
                    custom_timeouts=pulumi.CustomTimeouts(create=f"{BAKE_TIMEOUT_S // 60 + 30}m")
                ),
            ),
        )
