#!/usr/bin/env python3
"""The user-data stub of every torchfleet node, and what the node agent shares with it.

cloud-init writes this file, byte for byte, to /usr/local/lib/torchfleet/boot.py
(infra.bootstrap.render_user_data) and torchfleet-bootstrap.service runs `boot.py bootstrap` on
every boot until the node is ready:

  venv    the bootstrap venv (VENV) from the node's python3 with the cloud's pinned SDKs
          (SDK_PINS: boto3 on AWS; Alibaba's credentials, ESS, CloudMonitor and OSS SDKs) and
          node.json's pip_args (a mirror, a wheelhouse); kept while pins and options hold
  fetch   the bundle from the stack's bucket with the instance's own credentials (the instance
          role or ECS RAM role, from the metadata service); kept while its sha256 holds
  verify  its sha256 against node.json's bundle_sha256: any other bytes are refused
  unpack  into WORK/bundle-<sha256[:16]>, plain relative members only
  exec    the bundle's agent, `VENV/bin/python -m torchfleet_agent bootstrap`

Any other command (`boot.py COMMAND ...`, which /usr/local/sbin/torchfleet-node runs) execs the
unpacked agent at once. A failure before the agent runs is recorded in the state file (state
"failed", the stage, the error) and the journal; no lifecycle action is completed then, so the
launch hook's default result (ABANDON) removes the node at the hook's heartbeat timeout.

Python 3.8+, standard library only until the venv exists: SDKs are imported inside the functions
that use them. The agent takes its paths, JSON helpers, venvs and object fetches from here, so
the stub and the agent cannot disagree about them.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence, TypedDict

if TYPE_CHECKING:
    from alibabacloud_credentials.client import Client as AlibabaCredentials

CONFIG = "/etc/torchfleet/node.json"
STATE = "/var/lib/torchfleet/bootstrap.json"
WORK = "/var/lib/torchfleet/bootstrap"
VENV = "/opt/torchfleet/bootstrap/venv"
STUB = "/usr/local/lib/torchfleet/boot.py"  # where the user-data writes this file
COMMAND = "/usr/local/sbin/torchfleet-node"  # `boot.py "$@"`: what units and roles run
AGENT = "torchfleet_agent"  # the package, under agent/ in the bundle

# The bootstrap venv's pins, by cloud, for every node Python (3.8: Ubuntu 20.04; 3.9: Debian 11;
# 3.10-3.13): one universal resolution with environment markers (pip installs the lines whose
# markers hold), each Python getting the newest release that supports it with a manylinux wheel
# (nodes build no sdist, and an offline wheelhouse needs no build tools). alibabacloud-oss-v2,
# not oss2: maintained (oss2 has had no release since 2024), a wheel (oss2 is an sdist built on
# the node) and light (oss2 pulls the legacy aliyun-python-sdk-core and -kms).
SDK_PINS: dict[str, tuple[str, ...]] = {
    "aws": (
        "boto3==1.37.38 ; python_full_version < '3.9'",
        "boto3==1.42.97 ; python_full_version == '3.9.*'",
        "boto3==1.44.8 ; python_full_version >= '3.10'",
        "botocore==1.37.38 ; python_full_version < '3.9'",
        "botocore==1.42.97 ; python_full_version == '3.9.*'",
        "botocore==1.44.8 ; python_full_version >= '3.10'",
        "jmespath==1.0.1 ; python_full_version < '3.9'",
        "jmespath==1.1.0 ; python_full_version >= '3.9'",
        "python-dateutil==2.9.0.post0",
        "s3transfer==0.11.5 ; python_full_version < '3.9'",
        "s3transfer==0.16.1 ; python_full_version == '3.9.*'",
        "s3transfer==0.19.3 ; python_full_version >= '3.10'",
        "six==1.17.0",
        "urllib3==1.26.20 ; python_full_version < '3.10'",
        "urllib3==2.8.0 ; python_full_version >= '3.10'",
    ),
    "alicloud": (
        "alibabacloud-cms20190101==4.0.10",
        "alibabacloud-credentials==1.0.12",
        "alibabacloud-credentials-api==1.0.1",
        "alibabacloud-ess20220222==1.13.3",
        "alibabacloud-gateway-spi==0.0.4",
        "alibabacloud-oss-v2==1.4.1",
        "alibabacloud-tea==0.4.0",  # the newest with a wheel: nodes build no sdist
        "alibabacloud-tea-openapi==0.4.6",
        "alibabacloud-tea-util==0.3.15",
        "darabonba-core==1.0.9",
        "aiofiles==24.1.0",
        "aiohappyeyeballs==2.4.4 ; python_full_version < '3.9'",
        "aiohappyeyeballs==2.6.1 ; python_full_version == '3.9.*'",
        "aiohappyeyeballs==2.7.1 ; python_full_version >= '3.10'",
        "aiohttp==3.10.11 ; python_full_version < '3.9'",
        "aiohttp==3.13.5 ; python_full_version == '3.9.*'",
        "aiohttp==3.14.5 ; python_full_version >= '3.10'",
        "aiosignal==1.3.1 ; python_full_version < '3.9'",
        "aiosignal==1.4.0 ; python_full_version >= '3.9'",
        "apscheduler==3.11.3",
        "async-timeout==5.0.1 ; python_full_version < '3.11'",
        "attrs==25.3.0 ; python_full_version < '3.9'",
        "attrs==26.1.0 ; python_full_version >= '3.9'",
        "backports-zoneinfo==0.2.1 ; python_full_version < '3.9'",
        "certifi==2026.10.19.post1",
        "cffi==1.17.1 ; python_full_version < '3.9'",
        "cffi==2.0.0 ; python_full_version == '3.9.*'",
        "cffi==2.1.1 ; python_full_version >= '3.10'",
        "charset-normalizer==3.5.3",
        "crcmod-plus==2.1.0 ; python_full_version < '3.9'",  # 2.2.0 has no cp38 wheel
        "crcmod-plus==2.3.6 ; python_full_version >= '3.9'",
        "cryptography==47.0.0 ; python_full_version <= '3.9'",
        "cryptography==50.0.2 ; python_full_version > '3.9'",
        "frozenlist==1.5.0 ; python_full_version < '3.9'",
        "frozenlist==1.8.0 ; python_full_version >= '3.9'",
        "idna==3.15 ; python_full_version < '3.9'",
        "idna==3.20 ; python_full_version >= '3.9'",
        "multidict==6.1.0 ; python_full_version < '3.9'",
        "multidict==6.7.1 ; python_full_version == '3.9.*'",
        "multidict==7.1.0 ; python_full_version == '3.10.*'",
        "multidict==7.2.1 ; python_full_version >= '3.11'",
        "propcache==0.2.0 ; python_full_version < '3.9'",
        "propcache==0.4.1 ; python_full_version == '3.9.*'",
        "propcache==0.5.4 ; python_full_version >= '3.10'",
        "pycparser==2.23 ; python_full_version < '3.10'",
        "pycparser==3.11 ; python_full_version == '3.10.*'",
        "pycparser==3.12 ; python_full_version >= '3.11'",
        "pycryptodome==3.24.1 ; python_full_version < '3.9'",
        "pycryptodome==4.4.0 ; python_full_version >= '3.9'",
        "requests==2.32.4 ; python_full_version < '3.9'",
        "requests==2.32.5 ; python_full_version == '3.9.*'",
        "requests==2.34.2 ; python_full_version >= '3.10'",
        "typing-extensions==4.13.2 ; python_full_version < '3.9'",
        "typing-extensions==4.16.0 ; python_full_version >= '3.9'",
        "tzlocal==5.2 ; python_full_version < '3.9'",
        "tzlocal==5.3.1 ; python_full_version == '3.9.*'",
        "tzlocal==5.4.5 ; python_full_version >= '3.10'",
        "urllib3==2.2.3 ; python_full_version < '3.9'",
        "urllib3==2.6.3 ; python_full_version == '3.9.*'",
        "urllib3==2.8.0 ; python_full_version >= '3.10'",
        "websocket-client==1.8.0 ; python_full_version < '3.9'",
        "websocket-client==1.9.0 ; python_full_version == '3.9.*'",
        "websocket-client==1.9.2 ; python_full_version >= '3.10'",
        "yarl==1.15.2 ; python_full_version < '3.9'",
        "yarl==1.22.0 ; python_full_version == '3.9.*'",
        "yarl==1.25.1 ; python_full_version >= '3.10'",
    ),
}


class NodeConfig(TypedDict, total=False):
    """/etc/torchfleet/node.json: infra.bootstrap.BootstrapSpec as JSON."""

    cloud: str
    region: str
    stack: str
    bundle_bucket: str
    bundle_key: str
    bundle_sha256: str
    mode: str
    group_name: str | None
    launch_hook: str | None
    terminate_hook: str | None
    service_port: int
    metrics_namespace: str
    endpoints: dict[str, str]
    group_id: str | None
    metrics_group_id: str | None
    poweroff: bool
    pip_args: list[str]
    # the stack's API token in the cloud's secret store (read with the node's credentials), and
    # the load balancer this node leaves before a drain (AWS target group, Alibaba CLB id and
    # the VServer group the CLB's listeners forward to)
    api_token_secret: str | None
    target_group_arn: str | None
    load_balancer_id: str | None
    vserver_group_id: str | None
    # a rollout track's model instead of the bundle's: {"source": URL, "checksum": "sha256:.."}
    model: Mapping[str, str]


class Failure(Exception):
    """A bootstrap step that failed: the stage, what happened, and the Ansible task if any."""

    def __init__(self, stage: str, message: str, task: str | None = None) -> None:
        super().__init__(message)
        self.stage, self.message, self.task = stage, message, task


def log(msg: str) -> None:
    print("torchfleet-node: " + msg, flush=True)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_json(path: str, default: Any = None) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path: str, doc: Any, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(path + ".tmp", mode)
    os.replace(path + ".tmp", path)


def run(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
    log("$ " + " ".join(argv))
    return subprocess.run(list(argv), check=False, **kw)


def load_config() -> NodeConfig | None:
    cfg: NodeConfig | None = read_json(CONFIG)
    return cfg


def apt_install(packages: Sequence[str]) -> bool:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["dpkg", "--configure", "-a"], env=env)  # a reboot during dpkg leaves it half-configured
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    if run(install, env=env).returncode == 0:
        return True
    run(["apt-get", "update", "-q"], env=env)
    return run(install, env=env).returncode == 0


def ensure_venv(
    python: str,
    version: tuple[int, int],
    venv: str,
    requirements: Sequence[str],
    pip_args: Sequence[str],
) -> None:
    """A venv at `venv`, made by `python` (of `version`), with `requirements` installed; kept as
    long as the interpreter, the requirements and the pip options are the same."""
    stamp = os.path.join(venv, ".torchfleet-pins")
    want = hashlib.sha256(" ".join([python, *requirements, *pip_args]).encode()).hexdigest()
    if read_json(stamp) == want:
        return
    shutil.rmtree(venv, ignore_errors=True)
    if run([python, "-m", "venv", venv]).returncode != 0:
        # Debian and Ubuntu ship venv's pip (ensurepip) in a package of its own.
        package = "python{}.{}-venv".format(*version)
        shutil.rmtree(venv, ignore_errors=True)
        if not apt_install([package]) or run([python, "-m", "venv", venv]).returncode != 0:
            raise Failure("venv", f"cannot create {venv} with {python} (is {package} installable?)")
    listed = os.path.join(venv, "requirements.txt")
    with open(listed, "w") as f:
        f.write("\n".join(requirements) + "\n")
    pip = [venv + "/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    if run([*pip, *pip_args, "-r", listed]).returncode != 0:
        raise Failure("venv", f"pip could not install the pins of {listed}")
    write_json(stamp, want)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def bundle_tree(sha256: str) -> str:
    """Where a verified bundle is unpacked (one directory per bundle)."""
    return os.path.join(WORK, "bundle-" + sha256[:16])


def aws_client(cfg: NodeConfig, service: str) -> Any:
    """A boto3 client with the instance role's credentials (IMDSv2 only; endpoints overridable)."""
    import boto3

    endpoints = cfg.get("endpoints") or {}
    if "imds" in endpoints:
        os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = endpoints["imds"]
    os.environ["AWS_EC2_METADATA_V1_DISABLED"] = "true"
    session = boto3.session.Session(region_name=cfg["region"])
    return session.client(service, endpoint_url=endpoints.get(service))


def alibaba_credentials(cfg: NodeConfig) -> AlibabaCredentials:
    """The ECS RAM role's STS credentials from the metadata service in hardened mode (tokens
    only), refreshed by the SDK before they expire. The SDK always asks 100.100.100.200; an
    `imds` endpoint override reaches the fake as that address's HTTP proxy."""
    from alibabacloud_credentials.client import Client
    from alibabacloud_credentials.http import HttpOptions
    from alibabacloud_credentials.provider import EcsRamRoleCredentialsProvider

    imds = (cfg.get("endpoints") or {}).get("imds")
    provider = EcsRamRoleCredentialsProvider(
        disable_imds_v1=True,
        async_update_enabled=False,  # no scheduler thread: refreshed when a call finds them stale
        http_options=HttpOptions(proxy=imds) if imds else None,
    )
    return Client(provider=provider)


def oss_client(cfg: NodeConfig) -> Any:
    """An OSS client (V4 signatures) on the region's internal endpoint unless overridden."""
    import alibabacloud_oss_v2 as oss

    credentials = alibaba_credentials(cfg)

    def current() -> oss.credentials.Credentials:
        c = credentials.get_credential()
        return oss.credentials.Credentials(c.access_key_id, c.access_key_secret, c.security_token)

    config = oss.config.load_default()
    config.credentials_provider = oss.credentials.CredentialsProviderFunc(current)
    config.region = cfg["region"]
    endpoint = (cfg.get("endpoints") or {}).get("oss")
    if endpoint:
        config.endpoint = endpoint
    else:
        config.use_internal_endpoint = True
    return oss.Client(config)


def fetch_object(cfg: NodeConfig, bucket: str, key: str, dest: str) -> None:
    """Download an object of the node's cloud (S3 or OSS) to `dest` with the instance's own
    credentials: the bundle here, the model for the inference_runtime role (`fetch`)."""
    if cfg["cloud"] == "aws":
        aws_client(cfg, "s3").download_file(bucket, key, dest)
        return
    import alibabacloud_oss_v2 as oss

    oss_client(cfg).get_object_to_file(oss.GetObjectRequest(bucket=bucket, key=key), dest)


def fetch_bundle(cfg: NodeConfig) -> str:
    """The verified bundle unpacked (fetched only when the copy on disk does not verify)."""
    bundle, want = os.path.join(WORK, "bundle.tar.gz"), cfg["bundle_sha256"]
    if not (os.path.exists(bundle) and sha256_file(bundle) == want):
        os.makedirs(WORK, exist_ok=True)
        try:
            fetch_object(cfg, cfg["bundle_bucket"], cfg["bundle_key"], bundle + ".part")
        except Exception as err:
            raise Failure("fetch", f"{type(err).__name__}: {err}") from err
        got = sha256_file(bundle + ".part")
        if got != want:
            raise Failure(
                "verify",
                f"bundle {cfg['bundle_bucket']}/{cfg['bundle_key']} has sha256 {got}, "
                f"expected {want} (the stack's bundle_sha256): refusing to run it",
            )
        os.replace(bundle + ".part", bundle)
    tree = bundle_tree(want)
    if not os.path.isfile(os.path.join(tree, "manifest.json")):
        shutil.rmtree(tree + ".tmp", ignore_errors=True)
        with tarfile.open(bundle) as tar:
            for m in tar.getmembers():  # our own verified archive; still refuse any escape
                if (
                    m.name.startswith(("/", ".."))
                    or "/../" in m.name
                    or not (m.isfile() or m.isdir())
                ):
                    raise Failure(
                        "unpack", f"bundle member {m.name!r} is not a plain relative path"
                    )
            tar.extractall(tree + ".tmp")
        shutil.rmtree(tree, ignore_errors=True)
        os.replace(tree + ".tmp", tree)
    return tree


def in_venv() -> bool:
    return os.path.realpath(sys.prefix) == os.path.realpath(VENV)


def sdk_venv(cfg: NodeConfig) -> None:
    """The bootstrap venv, made by the interpreter running this file (the node's python3)."""
    started = time.time()
    version = (sys.version_info[0], sys.version_info[1])
    ensure_venv(sys.executable, version, VENV, SDK_PINS[cfg["cloud"]], cfg.get("pip_args") or [])
    log(f"bootstrap venv ready in {time.time() - started:.1f} s")


def record_failure(cfg: NodeConfig, err: Failure) -> None:
    """What the agent records for a failure, for one the agent never got to see."""
    doc: dict[str, Any] = read_json(STATE, {}) or {}
    doc.update(
        state="failed",
        stage=err.stage,
        failed_task=None,
        error=err.message,
        finished=now(),
        bundle_sha256=cfg.get("bundle_sha256"),
    )
    write_json(STATE, doc)
    log(f"FAILED in stage {err.stage}: {err.message}")


def agent_env(cfg: NodeConfig, environ: Mapping[str, str], started: float) -> dict[str, str]:
    """The agent's environment: its package and torchfleet-compat's (the host-vars contract) on
    the path, and when this boot's bootstrap began."""
    tree = bundle_tree(cfg["bundle_sha256"])
    env = dict(environ, PYTHONPATH=os.pathsep.join([agent_dir(tree), compat_dir(tree)]))
    env["TORCHFLEET_BOOT_STARTED"] = str(started)
    return env


def agent_dir(tree: str) -> str:
    """The agent package's parent in an unpacked bundle (infra.bundle)."""
    return os.path.join(tree, "agent")


def compat_dir(tree: str) -> str:
    """torchfleet_compat's parent in an unpacked bundle: the agent imports the host-vars
    contract from it, and Ansible ships it as the preflight module's module_utils."""
    return os.path.join(tree, "compat", "src")


def main(argv: Sequence[str]) -> int:
    # the first process of this boot's bootstrap, or the same run continued in the venv
    started = float(os.environ.get("TORCHFLEET_BOOT_STARTED") or time.time())
    cfg = load_config()
    if not cfg:
        log(f"no {CONFIG}: nothing to do")
        return 1
    python = os.path.join(VENV, "bin", "python")
    if list(argv[:1]) == ["bootstrap"]:
        try:
            if not in_venv():  # the SDKs first, then this file again in their interpreter
                sdk_venv(cfg)
                env = dict(os.environ, TORCHFLEET_BOOT_STARTED=str(started))
                os.execve(python, [python, os.path.abspath(__file__), *argv], env)
            fetched = time.time()
            fetch_bundle(cfg)
            log(f"bundle {cfg['bundle_sha256'][:12]} verified in {time.time() - fetched:.1f} s")
        except Failure as err:
            record_failure(cfg, err)
            return 1
    env = agent_env(cfg, os.environ, started)
    agent = agent_dir(bundle_tree(cfg["bundle_sha256"]))
    if not os.path.isdir(os.path.join(agent, AGENT)):
        log(f"no agent in {agent}: `{COMMAND} bootstrap` unpacks it")
        return 1
    os.execve(python, [python, "-m", AGENT, *argv], env)
    return 0  # not reached: execve replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
