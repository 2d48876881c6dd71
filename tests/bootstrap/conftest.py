"""Fixtures of the bootstrap tests: the caches the node test needs (made once, reused).

  .cache/bootstrap/moto-cp311/    moto[server] (the pin in requirements/dev.txt) for the node
                                  image's CPython 3.11, run by the image's python3 in the pod
  .cache/bootstrap/wheels-aws-cp311/  the node's venv pins for 3.11 (the stub's SDK_PINS and
                                  the agent's Ansible pins): the node's pip installs offline
                                  from it
  .cache/bootstrap/model/         a demo model the node fetches from moto's S3
torch comes from .cache/wheelhouse-cp311 (tests/roles/prepare_wheelhouse.sh), as in Molecule."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # nodekit, importable by name

from nodekit import (  # noqa: E402
    CACHE,
    REPO,
    VENV_BIN,
    _cross,
    _pip,
    _stamped,
    bootstrap_wheels_for,
    moto_requirement,
    node_image_for,
    torch_wheelhouse_for,
)


@pytest.fixture(scope="session")
def moto_site() -> Path:
    req = moto_requirement()
    return _stamped(
        CACHE / "moto-cp311",
        req,
        lambda d: _pip(
            "install",
            *_cross("--target", str(d), "-c", str(REPO / "requirements" / "constraints.txt")),
            req,
        ),
    )


@pytest.fixture(scope="session")
def bootstrap_wheels() -> Path:
    return bootstrap_wheels_for("3.11")


@pytest.fixture(scope="session")
def demo_model() -> Path:
    def make(d: Path) -> None:
        out = subprocess.run(
            [str(VENV_BIN / "torchfleet-runtime"), "demo-model", str(d)],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]

    return _stamped(CACHE / "model", "demo-model", make)


@pytest.fixture(scope="session")
def torch_wheelhouse() -> Path:
    return torch_wheelhouse_for("cp311")


@pytest.fixture(scope="session")
def node_image() -> str:
    for tool in ("podman", "runc", "catatonit"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: run `make setup`")
    return node_image_for("bookworm")
