"""Local stand-ins for cloud nodes: booted systemd containers reached over SSH (the demo, the
end-to-end test; the Molecule driver shares the key and port helpers).

A container node runs `localhost/torchfleet-bookworm:latest` (scripts/build_image.sh) with podman
`--runtime runc --systemd=always` and the ulimits systemd needs (docs/development/tests.md), its
sshd and its runtime port published on 127.0.0.1 only (podman picks free ports), the torch
wheelhouse mounted read-only, and the stack's login user (e.g. `ubuntu`) made with the throwaway
key and passwordless sudo, so Ansible logs in and becomes root as it does on a cloud image.

Every container carries the label `io.torchfleet.demo=<prefix>` and a name starting with that
prefix, which must start with `torchfleet-demo-`; `remove_nodes(prefix)` removes exactly those.
`start_nodes` reuses a node that already runs (the warm demo), so a converged node stays
converged.

Each node's model directory (the inference_runtime role's `inference_runtime_models_dir`,
MODELS_DIR here, which the demo passes to the role) is a folder of THIS machine bind-mounted
read-write into the container (`models_root/<node name>`), so a file the role or the runtime
writes there is a file here and the reverse. That is how `torchfleet rollout` reaches a
container node (infra/rollout/local.py): it writes the candidate beside the served file on this
machine and renames it over it, and the runtime inside sees one file or the other, never half of
one; the same code serves runtime processes on this machine, unchanged. The other way, copying
into the container (`podman cp`, then a rename inside), would give the local fleet a second way
to place a file, and a rename over a bind-mounted file is atomic as any other. Rootful podman
maps no user IDs: the role's group on the directory (`torchfleet`) is the same number on both
sides, and a file the rollout writes here (root, 0644) is readable by the service user."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.constants import SERVICE_PORT
from infra.deploy.stage import StageError
from infra.matrix import REPO_ROOT

IMAGE = "localhost/torchfleet-bookworm:latest"
IMAGE_SUITE = "bookworm"
PREFIX = "torchfleet-demo-"
LABEL = "io.torchfleet.demo"
# systemd as PID 1 needs more file handles and processes than podman's defaults
# (docs/development/tests.md, "Containers as nodes")
RUN_OPTIONS = (
    "--systemd=always",
    "--ulimit",
    "nofile=10000:20000",
    "--ulimit",
    "nproc=10000:10000",
)
SSH_WAIT_S = 90.0
# The runtime's model directory in a node (the role's inference_runtime_models_dir): a folder of
# this machine is mounted there (see the module's docstring).
MODELS_DIR = "/var/lib/torchfleet/models"


def missing_tools(*tools: str) -> list[str]:
    return [t for t in tools if shutil.which(t) is None]


def ensure_ssh_key(path: Path) -> Path:
    """A throwaway ed25519 key at `path` (made once). sshd's StrictModes refuses an
    authorized_keys that group or others may write, so the public half is 0644 whatever the
    umask."""
    pub = path.with_name(path.name + ".pub")
    if not (path.exists() and pub.exists()):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        pub.unlink(missing_ok=True)
        made = subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "torchfleet-throwaway",
                "-f",
                str(path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if made.returncode != 0:
            raise RuntimeError(f"ssh-keygen failed: {made.stderr.strip()}")
    path.chmod(0o600)
    pub.chmod(0o644)
    return path


def podman(
    *args: str, timeout: float = 120, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        ["podman", "--runtime", "runc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
    )
    if check and out.returncode != 0:
        raise StageError(
            "nodes",
            f"podman {' '.join(args[:2])} failed: {(out.stderr or out.stdout).strip()[-600:]}",
            fix="see podman's message; `make demo-clean` removes the demo's containers",
        )
    return out


def ensure_image(log: Callable[[str], None] | None = None) -> str:
    """Build the node image when missing (about a minute: debootstrap + import)."""
    if podman("image", "exists", IMAGE, check=False).returncode == 0:
        return f"{IMAGE} present"
    if log:
        log(f"  building {IMAGE} (debootstrap, about a minute)")
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "build_image.sh"), IMAGE_SUITE],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise StageError(
            "nodes",
            f"building {IMAGE} failed",
            details=(out.stdout + out.stderr).strip().splitlines()[-8:],
            fix="scripts/build_image.sh bookworm shows the whole error",
        )
    return out.stdout.strip().splitlines()[-1]


def ensure_wheelhouse(abi: str = "cp311") -> Path:
    """The offline torch wheelhouse the node's pip installs from (tests/roles/prepare_wheelhouse.sh)."""
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "tests" / "roles" / "prepare_wheelhouse.sh"), abi],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=REPO_ROOT,
    )
    if out.returncode != 0:
        raise StageError(
            "nodes",
            f"the {abi} wheelhouse is not ready",
            details=(out.stdout + out.stderr).strip().splitlines()[-6:],
            fix=f"run tests/roles/prepare_wheelhouse.sh {abi} and read its error",
        )
    return (REPO_ROOT / ".cache" / f"wheelhouse-{abi}").resolve()


@dataclass
class ContainerNode:
    name: str
    ip: str  # its address on the podman network: the node's "private" address
    ssh_port: int  # on 127.0.0.1
    service_port: int  # the runtime's port, published on 127.0.0.1
    created: bool  # False: an existing node was reused

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.service_port}"


def check_prefix(prefix: str) -> None:
    if not prefix.startswith(PREFIX) or not prefix.replace("-", "").isalnum():
        raise StageError(
            "refused",
            f"the demo's container prefix {prefix!r} must start with "
            f"{PREFIX!r} and hold only letters, digits and dashes",
            fix="set TORCHFLEET_DEMO_PREFIX=torchfleet-demo-<name>- or unset it",
        )


def _inspect(name: str) -> dict | None:
    out = podman("container", "inspect", name, check=False)
    if out.returncode != 0:
        return None
    data = json.loads(out.stdout)
    return data[0] if data else None


def _published(name: str, port: int) -> int:
    out = podman("port", name, f"{port}/tcp")
    return int(out.stdout.strip().splitlines()[0].rsplit(":", 1)[1])


def _make_login_user(name: str, user: str, public_key: str) -> None:
    """The cloud image's login user: key-only SSH, passwordless sudo (become), as on EC2/ECS."""
    if user == "root":
        script = (
            "install -d -m 700 /root/.ssh && cat > /root/.ssh/authorized_keys && "
            "chmod 600 /root/.ssh/authorized_keys"
        )
    else:
        script = (
            f"id {user} >/dev/null 2>&1 || useradd -m -s /bin/bash {user}; "
            f"install -d -m 700 -o {user} -g {user} /home/{user}/.ssh && "
            f"cat > /home/{user}/.ssh/authorized_keys && "
            f"chown {user}:{user} /home/{user}/.ssh/authorized_keys && "
            f"chmod 600 /home/{user}/.ssh/authorized_keys && "
            f"echo '{user} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/90-{user} && "
            f"chmod 440 /etc/sudoers.d/90-{user}"
        )
    podman("exec", "-i", name, "sh", "-c", script, stdin=public_key)


def _wait_ssh(port: int, deadline: float) -> bool:
    """True once sshd answers with its banner (the published port accepts before sshd runs)."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.settimeout(3)
                if sock.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def _mounts_models(info: dict, host_dir: Path) -> bool:
    return any(
        m.get("Destination") == MODELS_DIR and Path(m.get("Source", "")) == host_dir
        for m in info.get("Mounts") or []
    )


def start_nodes(
    prefix: str,
    count: int,
    key: Path,
    login_user: str,
    wheelhouse: Path,
    known_hosts: Path,
    models_root: Path,
) -> list[ContainerNode]:
    """`count` nodes (started, or reused when they run), node i's model directory mounted from
    `models_root/<its name>`."""
    check_prefix(prefix)
    public_key = key.with_name(key.name + ".pub").read_text()
    nodes = []
    for i in range(count):
        name = f"{prefix}node-{i}"
        info = _inspect(name)
        if info and info.get("Config", {}).get("Labels", {}).get(LABEL) != prefix:
            raise StageError(
                "refused",
                f"a container named {name} exists but is not this "
                "demo's (its label differs); refusing to touch it",
                fix="set TORCHFLEET_DEMO_PREFIX to another torchfleet-demo-<name>-",
            )
        models = (models_root / name).resolve()
        if info and not _mounts_models(info, models):
            raise StageError(
                "refused",
                f"{name} exists but does not mount {models} at {MODELS_DIR} (an older demo's "
                "node): `torchfleet rollout` could not reach its model",
                fix="make demo-clean, then make demo",
            )
        models.mkdir(parents=True, exist_ok=True)
        created = info is None
        if created:
            podman(
                "run",
                "-d",
                "--name",
                name,
                "--hostname",
                name,
                "--label",
                f"{LABEL}={prefix}",
                *RUN_OPTIONS,
                "-p",
                "127.0.0.1::22",
                "-p",
                f"127.0.0.1::{SERVICE_PORT}",
                "-v",
                f"{wheelhouse}:/opt/wheelhouse:ro",
                "-v",
                f"{models}:{MODELS_DIR}",
                IMAGE,
                "/sbin/init",
                timeout=300,
            )
        elif not (info or {}).get("State", {}).get("Running"):
            podman("start", name, timeout=300)
        _make_login_user(name, login_user, public_key)
        ip = podman(
            "container", "inspect", "-f", "{{.NetworkSettings.IPAddress}}", name
        ).stdout.strip()
        node = ContainerNode(
            name, ip, _published(name, 22), _published(name, SERVICE_PORT), created
        )
        if created and known_hosts.exists():
            subprocess.run(
                ["ssh-keygen", "-f", str(known_hosts), "-R", f"[127.0.0.1]:{node.ssh_port}"],
                capture_output=True,
                timeout=30,
            )
        nodes.append(node)
    deadline = time.monotonic() + SSH_WAIT_S
    for node in nodes:
        if not _wait_ssh(node.ssh_port, deadline):
            raise StageError(
                "nodes",
                f"sshd in {node.name} did not answer on 127.0.0.1:"
                f"{node.ssh_port} within {SSH_WAIT_S:.0f} s",
                host=node.name,
                fix=f"`podman logs {node.name}`; `make demo-clean` and re-run",
            )
    return nodes


def list_nodes(prefix: str) -> list[str]:
    out = podman(
        "ps", "-a", "--filter", f"label={LABEL}={prefix}", "--format", "{{.Names}}", check=False
    )
    return [n for n in out.stdout.split() if n.startswith(prefix)]


def remove_nodes(prefix: str) -> list[str]:
    """Remove this prefix's containers (and with them their published ports)."""
    check_prefix(prefix)
    names = list_nodes(prefix)
    if names:
        podman("rm", "-f", "-t", "5", *names, timeout=300)
    return names


def default_prefix() -> str:
    return os.environ.get("TORCHFLEET_DEMO_PREFIX") or PREFIX
