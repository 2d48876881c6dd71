"""Where `image: auto` looks for a base image per distro, and who logs in on it.

The nodes get their driver, CUDA and PyTorch from the Ansible roles (pinned by
compat/matrix.yml), so the base image is a plain distro image, not a vendor GPU image whose
preinstalled driver would fight the pinned one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageQuery:
    owner: str  # AWS account id / Alibaba image owner alias
    name_pattern: str  # AWS name filter (glob) / Alibaba name_regex
    login_user: str
    root_device: str = ""  # AWS: the image's root device name, for the encrypted root volume


AWS_IMAGES = {
    # Canonical's and Debian's official publisher accounts.
    "ubuntu-22.04": ImageQuery(
        "099720109477",
        "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*",
        "ubuntu",
        "/dev/sda1",
    ),
    "ubuntu-20.04": ImageQuery(
        "099720109477",
        "ubuntu/images/hvm-ssd/ubuntu-focal-20.04-amd64-server-*",
        "ubuntu",
        "/dev/sda1",
    ),
    "debian-11": ImageQuery("136693071363", "debian-11-amd64-*", "admin", "/dev/xvda"),
    "debian-12": ImageQuery("136693071363", "debian-12-amd64-*", "admin", "/dev/xvda"),
}

ALICLOUD_IMAGES = {
    "ubuntu-22.04": ImageQuery("system", r"^ubuntu_22_04_x64", "root"),
    "ubuntu-20.04": ImageQuery("system", r"^ubuntu_20_04_x64", "root"),
    "debian-11": ImageQuery("system", r"^debian_11_\d+_x64", "root"),
    "debian-12": ImageQuery("system", r"^debian_12_\d+_x64", "root"),
}


def query(cloud: str, distro: str) -> ImageQuery:
    return (AWS_IMAGES if cloud == "aws" else ALICLOUD_IMAGES)[distro]
