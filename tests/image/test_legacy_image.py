"""The legacy pin through the same Containerfile: the debootstrapped Debian 11 base (Python 3.9),
the cu116 profile with PyPI's torch 1.12.1 and numpy<2 from the cp39 wheelhouse (as the Molecule
`legacy` scenario pins it). The image must build, import the runtime, bridge torch and numpy
(the failure numpy 2 causes on torch 1.x), and pass `torchfleet-runtime check --json`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from image_helpers import record

pytestmark = [pytest.mark.image, pytest.mark.legacy, pytest.mark.timeout(1800)]

BRIDGE = (
    "import numpy, torch, torchfleet_runtime; "
    "t = torch.from_numpy(numpy.arange(4, dtype=numpy.float32)); "
    "print(torch.__version__, numpy.__version__, torchfleet_runtime.__version__, float(t.numpy().sum()))"
)


def test_legacy_image_builds_imports_and_passes_check(
    build_image: Callable[..., dict[str, Any]], podman: Callable[..., Any]
) -> None:
    built = build_image(
        "bullseye", "cp39", "--profile", "cu116", "--torch", "1.12.1", "--torchvision", ""
    )
    assert built["build_args"]["NUMPY"] == "numpy<2"
    record(
        "build_bullseye_cu116_legacy",
        {
            "build_s": built["build_s"],
            "size_bytes": built["size_bytes"],
            "size_mb": round(built["size_bytes"] / 1e6),
        },
    )
    image = built["image"]
    bridge = podman("run", "--rm", "--entrypoint", "python3", image, "-c", BRIDGE, timeout=180)
    assert bridge.returncode == 0, bridge.stderr[-3000:]
    torch_version, numpy_version, _, total = bridge.stdout.split()
    assert (
        torch_version.split("+")[0] == "1.12.1"
        and int(numpy_version.split(".")[0]) < 2
        and float(total) == 6.0
    )

    check = podman(
        "run",
        "--rm",
        "--entrypoint",
        "torchfleet-runtime",
        image,
        "check",
        "--json",
        "--profile",
        "cu116",
        "--path",
        "/",
        "--min-free-disk-gb",
        "0",
        timeout=180,
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    report = json.loads(check.stdout)
    rows = {row["name"]: row for row in report["checks"]}
    assert report["profile"] == "cu116" and report["ok"] is True
    assert rows["python"]["status"] == "ok" and rows["python"]["value"].startswith("3.9.")
    # PyPI's 1.12.1 (a CUDA 10.2 build) is not the profile's 1.12.1+cu116: a warning, not a failure.
    assert rows["torch"]["value"] == "1.12.1+cu102" and rows["torch"]["status"] == "warn"
    assert rows["gpu"]["status"] == "skip"
