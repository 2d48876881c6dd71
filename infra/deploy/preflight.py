"""Preflight of `torchfleet up|down|status`: everything the command needs, checked in one pass
before anything is created, each missing piece named with how to fix it.

Checks (each a `Check`: ok or not, what was found, the fix):
  stack config      Pulumi.<stack>.yaml through infra.config.load: the same one-pass ConfigError
                    the program raises, so a bad value never reaches `pulumi up`; a note when the
                    nodes' distro is past its standard support (compat/matrix.yml)
  prices            (`up`) the region's own prices (infra.pricing: cached for the program that
                    `pulumi up` runs), or the reference table and why; a note, never a refusal
  credentials       for THAT stack's cloud, read locally without calling the cloud:
                    AWS: botocore's credential chain (env vars, AWS_PROFILE + ~/.aws files,
                    SSO/assume-role/process profiles) minus its network providers (instance
                    metadata, container role); Alibaba: ALICLOUD_ACCESS_KEY + ALICLOUD_SECRET_KEY
                    (or the ALIBABA_CLOUD_* names) or a profile in ~/.aliyun/config.json
  pulumi CLI        on PATH (the Automation API drives it)
  pulumi backend    PULUMI_BACKEND_URL, PULUMI_ACCESS_TOKEN or a `pulumi login`, confirmed by
                    `pulumi whoami`; a self-managed backend also needs a secrets passphrase
  ssh               the ssh client and a private key whose public half is the stack's
                    torchfleet:ssh_public_key (a file, or a key loaded in ssh-agent); needed in
                    instances mode, where Ansible and the readiness tunnels log in
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra import config as stack_config
from infra.config import ConfigError, StackConfig
from infra.cost import estimate
from infra.credentials import ALI_FIX, CredentialsError, alicloud_keys, aws_credentials
from infra.matrix import REPO_ROOT
from infra.schedule import deploy_time
from infra.stacks import load_stack_config

KEY_CANDIDATES = ("id_ed25519", "id_ecdsa", "id_rsa")
SELF_MANAGED = ("file://", "s3://", "gs://", "azblob://", "postgres://")


@dataclass
class Check:
    name: str
    ok: bool
    found: str
    fix: str = ""
    required: bool = True


@dataclass
class Preflight:
    stack: str
    checks: list[Check] = field(default_factory=list)
    cfg: StackConfig | None = None
    ssh_key: str | None = None  # a private key file; None with ssh-agent

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.required and not c.ok]

    def lines(self, columns: int = 100) -> list[str]:
        """One entry per check, wrapped to `columns`: mark, name, what was found, the fix."""
        out = []
        width = max(len(c.name) for c in self.checks)
        pad = " " * (2 + 7 + 2 + width + 2)
        for c in self.checks:
            mark = "ok" if c.ok else ("MISSING" if c.required else "note")
            head = f"  {mark:<7}  {c.name:<{width}}  "
            out += _wrap(c.found, columns, head, pad) or [head]
            if not c.ok and c.fix:
                out += _wrap("fix: " + c.fix, columns, pad, pad + "     ")
        return out


def _wrap(text: str, columns: int, first: str, rest: str) -> list[str]:
    """Wrapped at spaces only: paths and commands stay whole."""
    return textwrap.wrap(
        text,
        columns,
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
        break_long_words=False,
    )


def _which(name: str, env: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=env.get("PATH", os.defpath))


# -- stack config -------------------------------------------------------------------------------


def check_config(stack: str, path: Path | None = None) -> tuple[Check, StackConfig | None]:
    try:
        values = load_stack_config(stack, path)
        cfg = stack_config.load(stack_config.raw_from_pulumi_config(values), stack)
    except FileNotFoundError as err:
        return Check(
            "stack config",
            False,
            str(err),
            f"create Pulumi.{stack}.yaml (copy an example stack file) or name an existing stack",
        ), None
    except ConfigError as err:
        lines = "; ".join(err.problems)
        return Check(
            "stack config",
            False,
            f"Pulumi.{stack}.yaml: {lines}",
            "fix each value above in the stack file (`make plan STACK=...` checks it offline)",
        ), None
    size = (
        f"{cfg.nodes.count} node(s)"
        if cfg.mode == "instances"
        else f"group {cfg.nodes.min}..{cfg.nodes.max} (desired {cfg.nodes.desired})"
    )
    return Check(
        "stack config",
        True,
        f"Pulumi.{stack}.yaml valid: {cfg.cloud} {cfg.region}, {cfg.mode} mode, {size} "
        f"x {cfg.instance_type.name} ({cfg.instance_type.gpu_model}"
        f"{', spot' if cfg.spot.enabled else ''})",
    ), cfg


def check_distro(cfg: StackConfig, today: str) -> Check | None:
    """A note (never a refusal) when the nodes' distro is past its standard support."""
    warning = stack_config.distro_warning(cfg, today)
    if warning is None:
        return None
    return Check(
        "distro support",
        False,
        warning,
        "move torchfleet:image_distro to a supported distro (`make plan` shows the result)",
        required=False,
    )


def check_prices(cfg: StackConfig, mode: str | None = None) -> tuple[Check, StackConfig]:
    """The region's own prices (infra.pricing, cached for the program that `pulumi up` runs
    next) or the reference table, and what the stack costs at most with them."""
    from infra.program import with_region_prices

    cfg = with_region_prices(cfg, mode)
    cost = estimate(cfg)
    caps = (
        ", spot cap " + ", ".join(f"{t.name} {cfg.spot_cap(t):g}" for t in cfg.instance_types)
        if cfg.spot.enabled
        else ""
    )
    found = (
        f"{cfg.book.describe()}: at most {cost.spot_cap_per_hour:.3f} {cost.currency}/h for the "
        f"whole bill{caps} {cost.currency}/h"
    )
    return Check("prices", cfg.book.origin != "reference", found, required=False), cfg


# -- cloud credentials --------------------------------------------------------------------------


def check_aws(env: Mapping[str, str]) -> Check:
    """botocore's chain, read locally (infra.credentials)."""
    try:
        creds = aws_credentials(env)
    except CredentialsError as err:
        return Check("AWS credentials", False, err.message, err.fix)
    if creds is None:
        return Check(
            "AWS credentials",
            False,
            "none in the AWS credential chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE, ~/.aws/credentials, ~/.aws/config)",
            "export AWS_PROFILE=NAME (after `aws configure --profile NAME` or "
            "`aws sso login --profile NAME`), or export AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY",
        )
    where = {
        "env": "environment variables",
        "shared-credentials-file": "~/.aws/credentials",
        "config-file": "~/.aws/config",
    }.get(creds.method, creds.method)
    profile = env.get("AWS_PROFILE")
    return Check(
        "AWS credentials",
        True,
        f"from {where}"
        + (f" (profile {profile})" if profile else "")
        + " - not verified against AWS until `pulumi up`",
    )


def check_alicloud(env: Mapping[str, str], home: Path) -> Check:
    try:
        keys = alicloud_keys(env, home)
    except CredentialsError as err:
        return Check("Alibaba credentials", False, err.message, err.fix)
    if keys is None:
        path = env.get("ALICLOUD_SHARED_CREDENTIALS_FILE") or home / ".aliyun" / "config.json"
        return Check(
            "Alibaba credentials",
            False,
            f"no ALICLOUD_ACCESS_KEY/ALICLOUD_SECRET_KEY and no {path}",
            ALI_FIX,
        )
    from_env = keys.source.startswith("ALI")
    found = f"from {keys.source}" if from_env else f"{keys.source} - not verified until `pulumi up`"
    return Check("Alibaba credentials", True, found)


# -- pulumi -------------------------------------------------------------------------------------


def check_pulumi_cli(env: Mapping[str, str]) -> Check:
    path = _which("pulumi", env)
    if not path:
        return Check(
            "pulumi CLI",
            False,
            "`pulumi` is not on PATH (the Automation API drives the CLI)",
            "install the Pulumi CLI (https://www.pulumi.com/docs/install/) and put it on PATH",
        )
    try:
        out = subprocess.run(
            [path, "version"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**env, "PULUMI_SKIP_UPDATE_CHECK": "true"},
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return Check("pulumi CLI", False, f"{path} does not run: {err}", "reinstall the Pulumi CLI")
    if out.returncode != 0:
        return Check(
            "pulumi CLI",
            False,
            f"`{path} version` failed: {out.stderr.strip()[:300]}",
            "reinstall the Pulumi CLI",
        )
    return Check("pulumi CLI", True, f"{path} {out.stdout.strip()}")


def _backend_url(env: Mapping[str, str], home: Path) -> tuple[str | None, str]:
    if env.get("PULUMI_BACKEND_URL"):
        return env["PULUMI_BACKEND_URL"], "PULUMI_BACKEND_URL"
    if env.get("PULUMI_ACCESS_TOKEN"):
        return "https://api.pulumi.com", "PULUMI_ACCESS_TOKEN"
    creds = Path(env.get("PULUMI_HOME") or home / ".pulumi") / "credentials.json"
    try:
        current = json.loads(creds.read_text()).get("current")
    except (OSError, ValueError):
        current = None
    return (current, f"`pulumi login` ({creds})") if current else (None, "")


def check_backend(
    stack: str, env: Mapping[str, str], home: Path, cli_ok: bool, stack_file: Path | None = None
) -> list[Check]:
    url, source = _backend_url(env, home)
    fix = (
        "`pulumi login` (Pulumi Cloud), or a self-managed backend: `pulumi login "
        "s3://BUCKET` / `pulumi login file://~/.pulumi-state`, or export PULUMI_BACKEND_URL"
    )
    if not url:
        return [
            Check(
                "pulumi backend",
                False,
                "not logged in to any backend (no "
                "PULUMI_BACKEND_URL, no PULUMI_ACCESS_TOKEN, no `pulumi login`)",
                fix,
            )
        ]
    checks = []
    if cli_ok:
        try:
            out = subprocess.run(
                [_which("pulumi", env) or "pulumi", "whoami", "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                env=dict(env),
            )
            ok = out.returncode == 0
            found = (out.stdout if ok else out.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            ok, found = False, str(err)
        if not ok:
            checks.append(
                Check(
                    "pulumi backend",
                    False,
                    f"{url} (from {source}): `pulumi whoami` failed: {found[:300]}",
                    fix,
                )
            )
            return checks
        try:
            who = json.loads(found)
            found = f"{who.get('user', '?')} at {who.get('url', url)}"
        except ValueError:
            pass
        checks.append(Check("pulumi backend", True, f"{found} (from {source})"))
    else:
        checks.append(
            Check("pulumi backend", True, f"{url} (from {source}); unconfirmed without the CLI")
        )
    if url.startswith(SELF_MANAGED):
        stack_file = stack_file or REPO_ROOT / f"Pulumi.{stack}.yaml"
        settings: dict[str, Any] = {}
        try:
            import yaml

            settings = yaml.safe_load(stack_file.read_text()) or {}
        except (OSError, ValueError):
            pass
        has_kms = str(settings.get("secretsprovider", "passphrase")) != "passphrase"
        if not has_kms and not (
            env.get("PULUMI_CONFIG_PASSPHRASE") or env.get("PULUMI_CONFIG_PASSPHRASE_FILE")
        ):
            checks.append(
                Check(
                    "secrets passphrase",
                    False,
                    f"the self-managed backend {url} encrypts stack secrets with a passphrase, and "
                    "none is set",
                    "export PULUMI_CONFIG_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE"
                    "), or use a KMS secrets provider (`pulumi stack change-secrets-provider "
                    "awskms://...`)",
                )
            )
    return checks


# -- ssh ----------------------------------------------------------------------------------------


def _key_id(public_line: str) -> str:
    """`type base64` of an OpenSSH public key line (the comment does not identify a key)."""
    return " ".join(public_line.split()[:2])


def _public_of(private: Path, env: Mapping[str, str]) -> str | None:
    pub = private.with_name(private.name + ".pub")
    if pub.exists():
        return pub.read_text().strip()
    keygen = _which("ssh-keygen", env)
    if not keygen:
        return None
    out = subprocess.run(
        [keygen, "-y", "-P", "", "-f", str(private)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    return out.stdout.strip() if out.returncode == 0 else None


def check_ssh(
    cfg: StackConfig | None, env: Mapping[str, str], home: Path, key: str | None
) -> tuple[list[Check], str | None]:
    required = cfg is None or cfg.mode == "instances"
    checks = []
    if not _which("ssh", env):
        checks.append(
            Check(
                "ssh",
                False,
                "the ssh client is not installed",
                "install openssh-client (`make setup` does on Debian)",
                required,
            )
        )
    if cfg is None:
        return checks, None
    want = _key_id(cfg.ssh_public_key)
    shown = want[:28] + "..." + want[-8:]
    candidates = [Path(key).expanduser()] if key else [home / ".ssh" / n for n in KEY_CANDIDATES]
    looked = []
    for path in candidates:
        looked.append(str(path))
        if path.exists() and (public := _public_of(path, env)) and _key_id(public) == want:
            checks.append(
                Check(
                    "ssh key", True, f"{path} matches torchfleet:ssh_public_key", required=required
                )
            )
            return checks, str(path)
    if env.get("SSH_AUTH_SOCK") and _which("ssh-add", env):
        looked.append("ssh-agent")
        out = subprocess.run(
            [_which("ssh-add", env) or "ssh-add", "-L"],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(env),
        )
        if any(_key_id(line) == want for line in out.stdout.splitlines()):
            checks.append(
                Check(
                    "ssh key",
                    True,
                    "ssh-agent holds the key of torchfleet:ssh_public_key",
                    required=required,
                )
            )
            return checks, None
    checks.append(
        Check(
            "ssh key",
            False,
            f"no private key here matches torchfleet:ssh_public_key ({shown}); looked at "
            + ", ".join(looked),
            f'set your own key: `pulumi config set -s {cfg.stack} torchfleet:ssh_public_key "$(cat '
            '~/.ssh/id_ed25519.pub)"` (make one with `ssh-keygen -t ed25519`), or pass '
            "--ssh-key PATH / load it into ssh-agent",
            required,
        )
    )
    return checks, None


# -- all of it ----------------------------------------------------------------------------------


def run(
    stack: str,
    ssh_key: str | None = None,
    stack_file: Path | None = None,
    need: tuple[str, ...] = ("config", "credentials", "pulumi", "ssh"),
) -> Preflight:
    """Every check in `need`, in one pass; never stops at the first problem. Reads the process
    environment and $HOME, as the Pulumi CLI, the cloud providers and ssh will."""
    env = dict(os.environ)
    home = Path(env.get("HOME") or Path.home())
    result = Preflight(stack)
    cloud = stack.partition("-")[0]
    if "config" in need:
        check, result.cfg = check_config(stack, stack_file)
        result.checks.append(check)
        if result.cfg:
            cloud = result.cfg.cloud
            distro = check_distro(result.cfg, deploy_time().date().isoformat())
            result.checks += [distro] if distro else []
            if "prices" in need:
                prices, result.cfg = check_prices(result.cfg)
                result.checks.append(prices)
    if "credentials" in need:
        if cloud == "aws":
            result.checks.append(check_aws(env))
        elif cloud == "alicloud":
            result.checks.append(check_alicloud(env, home))
        else:
            result.checks.append(
                Check(
                    "credentials",
                    False,
                    f"stack {stack!r} names no cloud (stacks are <aws|alicloud>-<env>)",
                    "rename the stack",
                )
            )
    if "pulumi" in need:
        cli = check_pulumi_cli(env)
        result.checks.append(cli)
        result.checks.extend(check_backend(stack, env, home, cli.ok, stack_file))
    if "ssh" in need:
        checks, result.ssh_key = check_ssh(result.cfg, env, home, ssh_key)
        result.checks.extend(checks)
    return result
