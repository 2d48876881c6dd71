"""runtime/Containerfile against the version matrix, and `make image` without a registry.

Fast (no image is built): the Containerfile's ARG defaults must be what the build script derives
from compat/matrix.yml for the default profile; the derivation itself is checked on the other
profiles; `make image` on a base that cannot be pulled stops at once and names it."""

from __future__ import annotations

import re
import subprocess
import uuid
from argparse import Namespace

import pytest
import yaml
from image_helpers import REPO, load_build_script

ARG_RE = re.compile(r"^ARG\s+(\w+)(?:=(.*))?$")
# The arguments whose defaults come from the matrix (or mean "not used") and must agree.
DERIVED = (
    "BASE",
    "CUDA_PROFILE",
    "TORCH",
    "TORCHVISION",
    "NUMPY",
    "WHEEL_INDEX",
    "INDEX_URL",
    "WHEELHOUSE",
    "EXTRA_CA_CERTS",
    "RUNTIME_EXTRAS",
)

script = load_build_script()


def containerfile_defaults() -> dict[str, set[str]]:
    """Every default each ARG is given anywhere in the file (a stage re-declares its ARGs)."""
    found: dict[str, set[str]] = {}
    for line in (REPO / "runtime" / "Containerfile").read_text().splitlines():
        match = ARG_RE.match(line.strip())
        if match and match.group(2) is not None:
            found.setdefault(match.group(1), set()).add(match.group(2).strip().strip('"'))
    return found


def derived(**overrides: object) -> dict[str, str]:
    opts = dict(
        profile=None,
        base=None,
        torch=None,
        torchvision=None,
        index_url=None,
        wheel_index=None,
        wheelhouse=None,
        extra_ca_certs=None,
        extras=None,
    )
    opts.update(overrides)
    matrix = script.load_matrix(str(script.matrix_path()))
    return script.build_args(Namespace(**opts), matrix)


def test_containerfile_defaults_are_the_matrix_default_profile() -> None:
    defaults = containerfile_defaults()
    expected = derived()
    assert expected["CUDA_PROFILE"] == "cu116"  # the default_profile (docs/contracts/versions.md)
    for key in DERIVED:
        assert key in defaults, f"runtime/Containerfile has no default for ARG {key}"
        assert defaults[key] == {expected[key]}, (
            f"ARG {key}: Containerfile default(s) {sorted(defaults[key])} != {expected[key]!r} "
            "derived from compat/matrix.yml by scripts/build_runtime_image.py"
        )


def test_default_build_is_cu116_on_an_ubuntu_inside_its_support() -> None:
    # cu116's toolkit is packaged only for distros past their standard support (ubuntu-20.04)
    args = derived()
    assert args["BASE"] == "docker.io/library/ubuntu:22.04"
    assert (args["TORCH"], args["TORCHVISION"]) == ("1.12.1+cu116", "0.13.1+cu116")
    assert args["NUMPY"] == "numpy<2"  # torch 1.x: the legacy pin
    assert args["WHEEL_INDEX"].endswith("/whl/cu116")


@pytest.mark.parametrize(
    ("profile", "base", "numpy"),
    [
        ("cu118", "docker.io/nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04", "numpy"),
        ("cu121", "docker.io/nvidia/cuda:12.1.1-cudnn8-runtime-ubuntu22.04", "numpy"),
        ("cpu", "docker.io/library/debian:12-slim", "numpy"),
    ],
)
def test_other_profiles_derive_their_base_and_pins(profile: str, base: str, numpy: str) -> None:
    args = derived(profile=profile)
    matrix = script.load_matrix(str(script.matrix_path()))
    assert args["BASE"] == base
    assert args["TORCH"] == matrix.profiles[profile].torch
    assert args["NUMPY"] == numpy
    # the gpu extra (NVML gauges, the HPA's GPU signal) wherever the profile has CUDA
    assert args["RUNTIME_EXTRAS"] == ("" if profile == "cpu" else "gpu")
    assert derived(profile=profile, extras="")["RUNTIME_EXTRAS"] == ""
    assert derived(profile=profile, extras="gpu,onnx")["RUNTIME_EXTRAS"] == "gpu,onnx"


def test_a_torch_override_keeps_the_numpy_rule_and_a_bad_profile_names_the_allowed_ones() -> None:
    assert derived(torch="1.12.1", torchvision="")["NUMPY"] == "numpy<2"
    assert derived(torch="1.12.1", torchvision="")["TORCHVISION"] == ""
    with pytest.raises(
        script.BuildError,
        match=r"--profile = 'cu999' is invalid; allowed: a profile of .*matrix.yml: "
        r"cu116, cu118, cu121, cpu",
    ):
        derived(profile="cu999")


@pytest.mark.image  # asks podman for the base
def test_make_image_stops_at_once_naming_a_base_that_cannot_be_pulled() -> None:
    base = f"localhost/torchfleet-image-test-missing-{uuid.uuid4().hex[:8]}:latest"
    done = subprocess.run(
        ["make", "image", f"BASE={base}"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert f"cannot pull the base image {base}" in done.stderr, done.stderr[-2000:]
    assert "make image BASE=" in done.stderr  # says how to build on a local base
    assert "STEP" not in done.stdout + done.stderr  # it stopped before any build step ran


def test_the_base_follows_the_matrix_toolkit_repos_and_pythons(tmp_path) -> None:
    """Only a distro inside its standard support on the day is a base: an Ubuntu that packages
    the toolkit gets NVIDIA's image, else the Ubuntu's own (the torch wheel bundles CUDA); with
    no Ubuntu in support, a clear stop."""
    raw = yaml.safe_load((REPO / "compat" / "matrix.yml").read_text())
    raw["profiles"]["cu121"]["toolkit_repos"] = ["ubuntu2204"]
    raw["profiles"]["cu118"]["toolkit_repos"] = ["debian11"]
    path = tmp_path / "matrix.yml"
    path.write_text(yaml.safe_dump(raw))
    matrix = script.load_matrix(str(path))
    assert (
        script.default_base(matrix, "cu121")
        == "docker.io/nvidia/cuda:12.1.1-cudnn8-runtime-ubuntu22.04"
    )
    assert script.default_base(matrix, "cu118", "2026-12-06") == "docker.io/library/ubuntu:22.04"
    # the day before ubuntu-20.04 left its support, cu116 still had NVIDIA's image on it
    assert (
        script.default_base(matrix, "cu116", "2025-05-31")
        == "docker.io/nvidia/cuda:11.6.2-cudnn8-runtime-ubuntu20.04"
    )
    assert script.default_base(matrix, "cu116", "2025-06-01") == "docker.io/library/ubuntu:22.04"
    with pytest.raises(script.BuildError, match="profile cu118: no Ubuntu .* pass --base"):
        script.default_base(matrix, "cu118", "2027-07-01")
