"""The image section: what each node boots and runs: the boot path (from scratch, a bake, a
baked image), the image and its distro, the CUDA profile (judged by compat/matrix.yml's rules
against the fleet's GPU and the distro's Python) and the root disk.

Each key is one field of `Image` (infra/config/keys.py says how a key is declared).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchfleet_compat import matrix as compat

from infra.catalog import InstanceType
from infra.config.keys import key
from infra.config.reader import Reader
from infra.matrix import Matrix

BOOT_MODES = ("cold", "bake", "baked")
MIN_DISK_OVERHEAD_GB = 30  # OS, driver, toolkit and logs on top of the matrix's free-disk minimum
_IMAGE_RE = {
    "aws": re.compile(r"^ami-[0-9a-f]{8,17}$"),
    "alicloud": re.compile(r"^[A-Za-z0-9_.-]{4,}$"),
}


def _boot(r: Reader, got: Mapping[str, Any]) -> str | None:
    boot = r.choice("boot", r.get("boot"), BOOT_MODES)
    if boot == "bake" and got["cloud"] == "alicloud":
        # pulumi_alicloud 4.0.0: ecs.EcsImagePipeline's build instance takes no RAM role, so it
        # cannot read the private bundle; ecs.Image from a builder instance is captured when the
        # instance is created, before the bake has run. See docs/deploy/alicloud.md.
        r.fail(
            "boot",
            boot,
            "cold | baked on alicloud (no image build under `pulumi up` "
            "here: bake on a builder node and set `image` to the captured image with "
            "boot: baked)",
        )
        return None
    return boot


def _image(r: Reader, got: Mapping[str, Any]) -> Any:
    image = r.get("image")
    if image != "auto" and (not isinstance(image, str) or not _IMAGE_RE[got["cloud"]].match(image)):
        r.fail("image", image)
    return image


def _image_distro(r: Reader, got: Mapping[str, Any]) -> str | None:
    return r.choice("image_distro", r.get("image_distro"), tuple(got["matrix"].distros))


def _cuda_profile(r: Reader, got: Mapping[str, Any]) -> str | None:
    """The profile, judged by the matrix's own rules (torchfleet_compat.matrix, as preflight and
    `check` judge a node): it must drive the instance type's GPU and, where the stack names the
    node's distro (not in mode: kubernetes, whose nodes run the runtime image), support that
    distro's Python. A stack that sets no profile gets the matrix's default where it fits; where
    it does not, one problem names the key to set and the profiles that fit both."""
    matrix, itype = got["matrix"], got["instance_type"]
    distro = got["image_distro"] if got["mode"] != "kubernetes" else None
    try:
        profile = matrix.profile(r.get("cuda_profile"), "cuda_profile")
    except compat.MatrixError:
        r.fail(
            "cuda_profile",
            r.get("cuda_profile"),
            "a profile of compat/matrix.yml: " + ", ".join(matrix.profiles),
        )
        return None
    misfits = _profile_misfits(matrix, profile, itype, distro)
    if misfits and r.get("cuda_profile") is None:
        fitting = [
            name
            for name, other in matrix.profiles.items()
            if not _profile_misfits(matrix, other, itype, distro)
        ]
        r.fail(
            "cuda_profile",
            None,
            f"set it: the default, {profile.name}, does not fit this stack ("
            + "; ".join(misfits)
            + f"); profiles that fit: {', '.join(fitting) or 'none'}",
        )
        return None
    for misfit in misfits:
        r.fail("cuda_profile", profile.name, misfit)
    return None if misfits else profile.name


def _profile_misfits(
    matrix: Matrix, profile: compat.Profile, itype: InstanceType | None, distro: str | None
) -> list[str]:
    """What is wrong with `profile` for this distro and instance type, as an allowed-values
    phrase each (empty: it fits)."""
    out = []
    if distro is not None:
        verdict = compat.python_verdict(matrix, profile, matrix.distros[distro].python)
        if not verdict.ok:
            out.append(
                f"a profile for {distro}'s Python {matrix.distros[distro].python} "
                f"({verdict.reason}): {', '.join(verdict.profiles)}; or an image_distro "
                f"{profile.name} supports: {', '.join(verdict.distros) or 'none'}"
            )
    if itype is not None:
        gpu = compat.resolve_gpu(matrix, declared_model=itype.gpu_model)
        verdict = compat.gpu_verdict(matrix, profile, gpu)
        if not verdict.ok:
            out.append(
                f"a profile that drives the {itype.gpu_model} of {itype.name} ({itype.gpu.arch}; "
                f"{verdict.reason}): {', '.join(verdict.profiles)}"
            )
    return out


def _disk_gb(r: Reader, got: Mapping[str, Any]) -> int | None:
    matrix = got["matrix"]
    min_disk = matrix.min_free_disk_gb + MIN_DISK_OVERHEAD_GB
    return r.number(
        "disk_gb",
        r.get("disk_gb"),
        int,
        min_disk,
        16384,
        f"an integer number of GiB in {min_disk}..16384 (the matrix asks for "
        f"{matrix.min_free_disk_gb} GiB free after the OS)",
    )


@dataclass(frozen=True, kw_only=True)
class Image:
    # cold: full site.yml at boot | bake: build an image first | baked: `image` is one
    boot: str = key(
        "string",
        "how nodes boot: configure from scratch, bake an image, or boot baked",
        " | ".join(BOOT_MODES),
        "cold",
        parse=_boot,
    )
    image: str = key(  # "auto" or an image id
        "string", "the node image", "auto | an image id (ami-... on AWS)", "auto", parse=_image
    )
    image_distro: str = key(
        "string",
        "the distro of the auto image (and the node's Python)",
        "a distro of compat/matrix.yml",
        "debian-12",
        parse=_image_distro,
    )
    cuda_profile: str = key(
        "string",
        "the CUDA profile of compat/matrix.yml",
        "a profile that drives the GPU and supports the distro's Python",
        derived="the matrix's default_profile where it fits (else set it)",
        parse=_cuda_profile,
    )
    disk_gb: int = key(
        "integer",
        "the node's root disk in GiB",
        f"matrix min_free_disk_gb + {MIN_DISK_OVERHEAD_GB}..16384",
        100,
        parse=_disk_gb,
    )
