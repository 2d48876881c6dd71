"""The node bundle's bucket on AWS: private, encrypted, versioned, TLS-only, and the bundle
object itself at its content-addressed key.

Encryption is SSE-S3 (AES256), not SSE-KMS: the bundle holds no secret (roles, playbooks, the
runtime wheel; secrets stay in Ansible vault or Pulumi secrets), so a KMS key would add a second
grant to keep in step with the node role, a key policy, KMS request costs on every node launch
and a failure mode (a node that may read the object but not decrypt it) without protecting
anything more. Access is decided by the node role's grant on `bundles/<stack>/*`, the public
access block and the deny-non-TLS bucket policy.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.config import StackConfig
from infra.nodeboot import NONCURRENT_DAYS, bundle_url, stack_bundle


class AwsBundleStore(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:aws:Bundle", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.bundle = stack_bundle(cfg)
        self.prefix = f"bundles/{cfg.stack}/"
        # A reproducible build artefact: destroying the stack may delete it with the bucket.
        self.bucket = aws.s3.Bucket(
            f"{name}-bucket",
            bucket_prefix=f"{cfg.name}-bundles-",
            force_destroy=True,
            tags=tags,
            opts=child,
        )
        ownership, public, encryption = self._private(name, child)
        versioning = self._versioned(name, child)
        policy = self._tls_only(name, public, child)
        self.object = aws.s3.BucketObjectv2(
            f"{name}-object",
            bucket=self.bucket.id,
            key=self.bundle.key,
            source=pulumi.FileAsset(str(self.bundle.path)),
            content_type="application/gzip",
            metadata={"sha256": self.bundle.sha256, "version": self.bundle.version},
            tags=tags,
            # Encrypted and versioned from its first byte; readable only once the policy holds.
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(depends_on=[ownership, encryption, versioning, policy]),
            ),
        )
        self.read_arn = self.bucket.arn.apply(lambda arn: f"{arn}/{self.prefix}*")
        self.outputs = {
            "bundle_sha256": self.bundle.sha256,
            "bundle_url": self.bucket.bucket.apply(lambda b: bundle_url(cfg, b, self.bundle.key)),
            "bundle_version": self.bundle.version,
        }
        self.register_outputs({"bucket": self.bucket.bucket, "key": self.bundle.key})

    def _private(
        self, name: str, child: pulumi.ResourceOptions
    ) -> tuple[
        aws.s3.BucketOwnershipControls,
        aws.s3.BucketPublicAccessBlock,
        aws.s3.BucketServerSideEncryptionConfiguration,
    ]:
        """The bucket owns its objects (no ACLs), refuses public access and encrypts at rest."""
        bucket_id = self.bucket.id
        ownership = aws.s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=bucket_id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child,
        )
        public = aws.s3.BucketPublicAccessBlock(
            f"{name}-private",
            bucket=bucket_id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        encryption = aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-sse",
            bucket=bucket_id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="AES256"
                    )
                )
            ],
            opts=child,
        )
        return ownership, public, encryption

    def _versioned(self, name: str, child: pulumi.ResourceOptions) -> aws.s3.BucketVersioning:
        """Versioning, and the lifecycle that expires old bundles' versions."""
        bucket_id = self.bucket.id
        versioning = aws.s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket_id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(
                status="Enabled"
            ),
            opts=child,
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket_id,
            rules=[
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-old-bundles",
                    status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix="bundles/"),
                    noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=NONCURRENT_DAYS
                    ),
                    abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=1
                    ),
                )
            ],
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[versioning])
            ),
        )
        return versioning

    def _tls_only(
        self, name: str, public: aws.s3.BucketPublicAccessBlock, child: pulumi.ResourceOptions
    ) -> aws.s3.BucketPolicy:
        """A policy that refuses every request without TLS (after the public-access block)."""
        bucket_id = self.bucket.id
        return aws.s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket_id,
            policy=self.bucket.arn.apply(
                lambda arn: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Sid": "DenyInsecureTransport",
                                "Effect": "Deny",
                                "Principal": "*",
                                "Action": "s3:*",
                                "Resource": [arn, f"{arn}/*"],
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        ],
                    }
                )
            ),
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[public])),
        )
