"""The node bundle's bucket on Alibaba Cloud: a private, AES256-encrypted (SSE-OSS; the same
reasoning as on AWS, infra/aws/bundle_store.py: nothing secret inside, one grant to keep in step),
versioned OSS bucket that refuses plain HTTP and TLS below 1.2, and the bundle object at its
content-addressed key."""

from __future__ import annotations

import json

import pulumi
import pulumi_alicloud as alicloud

from infra.config import StackConfig
from infra.nodeboot import NONCURRENT_DAYS, bundle_url, stack_bundle


class AlicloudBundleStore(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("torchfleet:alicloud:Bundle", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.bundle = stack_bundle(cfg)
        self.prefix = f"bundles/{cfg.stack}/"
        # No name: OSS names are global; the provider picks a unique one.
        self.bucket = alicloud.oss.Bucket(
            f"{name}-bucket",
            storage_class="Standard",
            force_destroy=True,
            lifecycle_rules=[
                alicloud.oss.BucketLifecycleRuleArgs(
                    id="expire-old-bundles",
                    enabled=True,
                    prefix="bundles/",
                    noncurrent_version_expirations=[
                        alicloud.oss.BucketLifecycleRuleNoncurrentVersionExpirationArgs(
                            days=NONCURRENT_DAYS
                        )
                    ],
                )
            ],
            tags=tags,
            opts=child,
        )
        name_ = self.bucket.bucket
        settings = [
            alicloud.oss.BucketAcl(f"{name}-acl", bucket=name_, acl="private", opts=child),
            alicloud.oss.BucketPublicAccessBlock(
                f"{name}-private", bucket=name_, block_public_access=True, opts=child
            ),
            alicloud.oss.BucketServerSideEncryption(
                f"{name}-sse", bucket=name_, sse_algorithm="AES256", opts=child
            ),
            alicloud.oss.BucketVersioning(
                f"{name}-versioning", bucket=name_, status="Enabled", opts=child
            ),
            alicloud.oss.BucketHttpsConfig(
                f"{name}-tls",
                bucket=name_,
                enable=True,
                tls_versions=["TLSv1.2", "TLSv1.3"],
                opts=child,
            ),
            alicloud.oss.BucketPolicy(
                f"{name}-tls-only",
                bucket=name_,
                policy=name_.apply(
                    lambda b: json.dumps(
                        {
                            "Version": "1",
                            "Statement": [
                                {
                                    "Effect": "Deny",
                                    "Principal": ["*"],
                                    "Action": ["oss:*"],
                                    "Resource": [f"acs:oss:*:*:{b}", f"acs:oss:*:*:{b}/*"],
                                    "Condition": {"Bool": {"acs:SecureTransport": ["false"]}},
                                }
                            ],
                        }
                    )
                ),
                opts=child,
            ),
        ]
        self.object = alicloud.oss.BucketObject(
            f"{name}-object",
            bucket=name_,
            key=self.bundle.key,
            source=str(self.bundle.path),
            content_type="application/gzip",
            server_side_encryption="AES256",
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=settings)),
        )
        self.read_arn = name_.apply(lambda b: f"acs:oss:*:*:{b}/{self.prefix}*")
        self.outputs = {
            "bundle_sha256": self.bundle.sha256,
            "bundle_url": name_.apply(lambda b: bundle_url(cfg, b, self.bundle.key)),
            "bundle_version": self.bundle.version,
        }
        self.register_outputs({"bucket": name_, "key": self.bundle.key})
