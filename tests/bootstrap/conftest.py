"""Fixtures of the bootstrap tests: the caches the node test needs (made once, reused).

  .cache/bootstrap/moto-cp311/    moto[server] (the pin in requirements/dev.txt) for the node
                                  image's CPython 3.11, run by the image's python3 in the pod
  .cache/bootstrap/wheels-cp311/  the node agent's bootstrap pins (infra/bootstrap/agent.py
                                  PINS) for 3.11: the node's pip installs offline from it
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

from nodekit import CACHE, REPO, VENV_BIN, _cross, _pip, _stamped, moto_requirement  # noqa: E402


@pytest.fixture(scope="session")
def moto_site() -> Path:
    req = moto_requirement()
    return _stamped(CACHE / "moto-cp311", req, lambda d: _pip(
        "install", *_cross("--target", str(d), "-c", str(REPO / "requirements" / "constraints.txt")), req))


@pytest.fixture(scope="session")
def bootstrap_wheels() -> Path:
    from infra.bootstrap import agent

    reqs = agent.pins((3, 11), "aws")
    return _stamped(CACHE / "wheels-cp311", " ".join(reqs), lambda d: _pip(
        "download", *_cross("-d", str(d)), *reqs))


@pytest.fixture(scope="session")
def demo_model() -> Path:
    def make(d: Path) -> None:
        out = subprocess.run([str(VENV_BIN / "torchfleet-runtime"), "demo-model", str(d)],
                             capture_output=True, text=True, check=False, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]

    return _stamped(CACHE / "model", "demo-model", make)


@pytest.fixture(scope="session")
def torch_wheelhouse() -> Path:
    out = subprocess.run(["bash", str(REPO / "tests" / "roles" / "prepare_wheelhouse.sh"), "cp311"],
                         cwd=REPO, capture_output=True, text=True, check=False, timeout=1800)
    assert out.returncode == 0, f"wheelhouse failed:\n{(out.stdout + out.stderr)[-3000:]}"
    return (REPO / ".cache" / "wheelhouse-cp311").resolve()


@pytest.fixture(scope="session")
def node_image() -> str:
    for tool in ("podman", "runc", "catatonit"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: run `make setup`")
    out = subprocess.run(["bash", str(HERE / "build_node_image.sh")], cwd=REPO,
                         capture_output=True, text=True, check=False, timeout=1200)
    assert out.returncode == 0, f"node image failed:\n{(out.stdout + out.stderr)[-3000:]}"
    return "localhost/torchfleet-bookworm-cloudinit:latest"
