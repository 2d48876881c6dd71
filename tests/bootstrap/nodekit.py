"""Helpers of the bootstrap and inventory tests (importable by name: conftest puts this
directory on sys.path): podman calls with the repo's podman settings, loopback ports, and the
caches the node test needs, each made once under .cache/bootstrap/."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = REPO / ".cache" / "bootstrap"
VENV_BIN = Path(sys.executable).parent
PLATFORMS = [
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_34_x86_64",
]


def podman_env() -> dict[str, str]:
    return dict(os.environ, CONTAINERS_CONF=str(REPO / "tests" / "roles" / "containers.conf"))


def podman(*args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        env=podman_env(),
        timeout=timeout,
        check=False,
    )
    if check and out.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} failed ({out.returncode}):\n"
            f"{out.stdout[-2000:]}{out.stderr[-2000:]}"
        )
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stamped(dest: Path, want: str, make) -> Path:
    stamp = dest / ".complete"
    if stamp.exists() and stamp.read_text() == want:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    make(dest)
    stamp.write_text(want)
    return dest


def _pip(*args: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert out.returncode == 0, f"pip {' '.join(args[:3])} failed:\n{out.stderr[-3000:]}"


def _cross(*args: str, python: str = "3.11") -> list[str]:
    """pip options for wheels of a node image's CPython (3.11: Debian 12; a patch level where
    packages exclude some: cryptography skips 3.9.0 and 3.9.1), whatever runs the tests."""
    abi = "cp" + "".join(python.split(".")[:2])
    return [
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        *[a for p in PLATFORMS for a in ("--platform", p)],
        *args,
    ]


def moto_requirement() -> str:
    lines = (REPO / "requirements" / "dev.txt").read_text().splitlines()
    return next(line for line in lines if line.startswith("moto["))


def node_image_for(suite: str) -> str:
    """localhost/torchfleet-SUITE-cloudinit (built once by build_node_image.sh)."""
    out = subprocess.run(
        ["bash", str(HERE / "build_node_image.sh"), suite],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    assert out.returncode == 0, f"node image failed:\n{(out.stdout + out.stderr)[-3000:]}"
    return f"localhost/torchfleet-{suite}-cloudinit:latest"


def sdk_pins_for(cloud: str, python: str) -> list[str]:
    """The stub's bootstrap-venv pins (boot.SDK_PINS) that pip installs on CPython `python`
    ("3.11", "3.9.2"): the lines whose environment markers hold there, without the markers.
    (pip download evaluates markers for the Python it runs on, not the one it downloads for.)"""
    from packaging.requirements import Requirement

    from infra.bootstrap.torchfleet_agent import boot

    full = python if python.count(".") == 2 else python + ".0"
    env = {"python_version": ".".join(full.split(".")[:2]), "python_full_version": full}
    chosen = []
    for line in boot.SDK_PINS[cloud]:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            chosen.append(f"{req.name}{req.specifier}")
    return chosen


def bootstrap_wheels_for(python: str, cloud: str = "aws") -> Path:
    """The node's venv pins for CPython `python` ("3.11", "3.9.2"), once: the stub's bootstrap
    venv (the cloud's SDKs) and the agent's Ansible venv."""
    from infra.bootstrap.torchfleet_agent import playbook

    major, minor = (int(p) for p in python.split(".")[:2])
    sdks, ansible = sdk_pins_for(cloud, python), playbook.pins((major, minor))

    def download(d: Path) -> None:
        # the SDK pins are a whole resolution already; ansible-core's are resolved here
        _pip("download", *_cross("--no-deps", "-d", str(d), python=python), *sdks)
        _pip("download", *_cross("-d", str(d), python=python), *ansible)

    return _stamped(CACHE / f"wheels-{cloud}-cp{major}{minor}", " ".join(sdks + ansible), download)


def torch_wheelhouse_for(abi: str) -> Path:
    """.cache/wheelhouse-ABI, as the Molecule scenarios use it (tests/roles/prepare_wheelhouse.sh)."""
    out = subprocess.run(
        ["bash", str(REPO / "tests" / "roles" / "prepare_wheelhouse.sh"), abi],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert out.returncode == 0, f"wheelhouse failed:\n{(out.stdout + out.stderr)[-3000:]}"
    return (REPO / ".cache" / f"wheelhouse-{abi}").resolve()
