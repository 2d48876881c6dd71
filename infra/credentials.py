"""Cloud credentials as this machine holds them, found without calling any cloud.

Contract: the one place that knows where the controller's credentials come from, for the deploy
preflight (which reports them) and for the calls torchfleet itself makes (prices, the bill):
- AWS: botocore's credential chain (env vars, AWS_PROFILE + ~/.aws files, SSO/assume-role/process
  profiles) minus its network providers (instance metadata, container role), so looking never
  waits on a metadata endpoint off the cloud. `aws_credentials()` returns botocore's
  credentials or None, or raises `CredentialsError` with what is wrong and how to fix it.
- Alibaba: ALICLOUD_ACCESS_KEY + ALICLOUD_SECRET_KEY (+ ALICLOUD_SECURITY_TOKEN), the
  ALIBABA_CLOUD_* names, or an AK profile named by ALICLOUD_PROFILE in ~/.aliyun/config.json
  (ALICLOUD_SHARED_CREDENTIALS_FILE) — what the Pulumi provider reads. `alicloud_keys()` returns
  `AlicloudKeys` (with where they came from) or raises `CredentialsError`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ALI_KEY_ENV = (
    ("ALICLOUD_ACCESS_KEY", "ALICLOUD_SECRET_KEY"),
    ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET"),
)
ALI_TOKEN_ENV = ("ALICLOUD_SECURITY_TOKEN", "ALIBABA_CLOUD_SECURITY_TOKEN")
ALI_FIX = (
    "export ALICLOUD_ACCESS_KEY and ALICLOUD_SECRET_KEY, or `aliyun configure --profile "
    "NAME` and export ALICLOUD_PROFILE=NAME"
)


class CredentialsError(Exception):
    """Credentials are configured but unusable: `message` says what, `fix` what to do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message, self.fix = message, fix


def aws_credentials(env: Mapping[str, str]) -> Any:
    """botocore's credentials from the local chain, or None when there are none."""
    import botocore.exceptions
    import botocore.session

    try:
        resolver = botocore.session.Session().get_component("credential_provider")
        for name in ("iam-role", "container-role"):
            if any(name == p.METHOD for p in resolver.providers):
                resolver.remove(name)
        return resolver.load_credentials()
    except botocore.exceptions.ProfileNotFound as err:
        profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE")
        raise CredentialsError(
            f"{err} (AWS_PROFILE={profile})",
            "name a profile of ~/.aws/config or ~/.aws/credentials "
            "(`aws configure --profile NAME`), or unset AWS_PROFILE",
        ) from None
    except botocore.exceptions.BotoCoreError as err:
        raise CredentialsError(
            f"the AWS credential chain failed: {err}",
            "fix the profile in ~/.aws/config (see the error), or export "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ) from None


@dataclass(frozen=True)
class AlicloudKeys:
    access_key_id: str
    access_key_secret: str
    security_token: str | None
    source: str  # where they came from, for messages

    def config(self, region: str, endpoint: str | None = None) -> Any:
        """An OpenAPI client configuration with short timeouts; `endpoint` (a URL) overrides the
        product's endpoint (a local fake in the tests)."""
        from urllib.parse import urlsplit

        from alibabacloud_tea_openapi.models import Config

        config = Config(
            access_key_id=self.access_key_id,
            access_key_secret=self.access_key_secret,
            security_token=self.security_token,
            region_id=region,
            connect_timeout=3000,
            read_timeout=6000,
        )
        if endpoint:
            url = urlsplit(endpoint)
            config.endpoint, config.protocol = url.netloc, url.scheme
        return config


def alicloud_keys(env: Mapping[str, str], home: Path) -> AlicloudKeys | None:
    """The access key the Pulumi provider would use, or None when none is configured."""
    token = next((env[k] for k in ALI_TOKEN_ENV if env.get(k)), None)
    for key, secret in ALI_KEY_ENV:
        if env.get(key) and env.get(secret):
            return AlicloudKeys(env[key], env[secret], token, f"{key}/{secret}")
        if env.get(key) or env.get(secret):
            raise CredentialsError(
                f"only one of {key} and {secret} is set", f"export both {key} and {secret}"
            )
    path = Path(env.get("ALICLOUD_SHARED_CREDENTIALS_FILE") or home / ".aliyun" / "config.json")
    profile = env.get("ALICLOUD_PROFILE") or env.get("ALIBABA_CLOUD_PROFILE")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise CredentialsError(f"{path} is unreadable: {err}", ALI_FIX) from None
    profiles = {p.get("name"): p for p in data.get("profiles") or [] if isinstance(p, dict)}
    if not profile:
        raise CredentialsError(
            f"{path} has profile(s) {', '.join(map(str, profiles)) or 'none'} but "
            "ALICLOUD_PROFILE is not set (the provider reads a profile only when named)",
            f"export ALICLOUD_PROFILE={data.get('current') or 'NAME'}",
        )
    p = profiles.get(profile)
    if p is None:
        raise CredentialsError(
            f"ALICLOUD_PROFILE={profile} is not in {path} "
            f"(profiles: {', '.join(map(str, profiles)) or 'none'})",
            ALI_FIX,
        )
    mode = p.get("mode", "AK")
    if mode == "AK" and not (p.get("access_key_id") and p.get("access_key_secret")):
        raise CredentialsError(
            f"profile {profile} in {path} has no access_key_id/access_key_secret", ALI_FIX
        )
    return AlicloudKeys(
        str(p.get("access_key_id") or ""),
        str(p.get("access_key_secret") or ""),
        p.get("sts_token") or None,
        f"profile {profile} ({mode}) in {path}",
    )


def operator_config(region: str, service: str, endpoint_env: str) -> Any:
    """An OpenAPI client configuration with the operator's Alibaba keys (the ones the Pulumi
    provider reads) for a call to `service`; the environment variable `endpoint_env` (a URL)
    overrides the region's endpoint. CredentialsError says what is missing and the fix."""
    import os

    keys = alicloud_keys(os.environ, Path(os.environ.get("HOME") or Path.home()))
    if keys is None:
        raise CredentialsError(f"no Alibaba Cloud credentials to reach {service}", ALI_FIX)
    return keys.config(region, os.environ.get(endpoint_env))
