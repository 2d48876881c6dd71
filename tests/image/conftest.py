"""Shared helpers for the container image tests: podman with the repo's settings, building the
image through scripts/build_runtime_image.py on a locally made base, and the figures file.

No registry is reachable here, so every build starts from the debootstrapped images the Molecule
scenarios use (scripts/build_image.sh) and installs torch from a host wheelhouse
(tests/roles/prepare_wheelhouse.sh). Every image and container made here is named
`torchfleet-image-test-<random>` and removed afterwards; podman's layer cache (untagged
intermediate images) is kept on purpose, so a second run rebuilds only what changed, for a day:
untagged images older than that are pruned at the end, so runs do not pile up layers forever.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # image_helpers, importable by name

from image_helpers import CONTAINERS_CONF, REPO, unique_name


@pytest.fixture(scope="session")
def podman_env() -> dict[str, str]:
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.fail("podman and runc are needed: run `make setup`")
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="session")
def podman(podman_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(
        *args: str, timeout: float = 120, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["podman", *args], env=podman_env, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            pytest.fail(
                f"podman {' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}"
            )
        return result

    return run


@pytest.fixture(scope="session")
def build_image(
    podman_env: dict[str, str], podman: Callable[..., Any]
) -> Iterator[Callable[..., dict[str, Any]]]:
    """build_image(suite, abi, *extra_args) -> the build script's JSON (image, size, build_s):
    the image built from runtime/Containerfile on localhost/torchfleet-<suite>, torch from
    .cache/wheelhouse-<abi>, the host's extra CA certificates passed in. Removed at the end."""
    made: list[str] = []

    def build(suite: str, abi: str, *extra: str) -> dict[str, Any]:
        for cmd, timeout in (
            (["bash", "scripts/build_image.sh", suite], 900),
            (["bash", "tests/roles/prepare_wheelhouse.sh", abi], 1800),
        ):
            done = subprocess.run(
                cmd, cwd=REPO, env=podman_env, capture_output=True, text=True, timeout=timeout
            )
            assert done.returncode == 0, (
                f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-3000:]}"
            )
        tag = f"localhost/{unique_name(suite)}:latest"
        made.append(tag)
        cmd = [
            sys.executable,
            "scripts/build_runtime_image.py",
            "--engine",
            "podman",
            "--base",
            f"localhost/torchfleet-{suite}:latest",
            "--wheelhouse",
            f".cache/wheelhouse-{abi}",
            "--tag",
            tag,
            *extra,
        ]
        certs = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
        if certs:  # TLS inspected here (docs/development/tests.md): the build's extra-CA path runs
            cmd += ["--extra-ca-certs", *map(str, certs)]
        done = subprocess.run(
            cmd, cwd=REPO, env=podman_env, capture_output=True, text=True, timeout=1800
        )
        assert done.returncode == 0, f"image build failed:\n{done.stderr[-6000:]}"
        return json.loads(done.stdout.strip().splitlines()[-1])

    yield build
    for tag in made:
        # --no-prune: the untagged intermediate images stay, as the layer cache of the next run.
        podman("rmi", "--no-prune", tag, timeout=300)
    # ...but not forever: every run's labels (created, revision) leave one more untagged chain.
    podman("image", "prune", "--force", "--filter", "until=24h", timeout=600)
