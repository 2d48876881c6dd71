#!/usr/bin/env python3
"""Read-only node probe for the torchfleet preflight role.

Prints one JSON document describing what the node has: its Python, running kernel and whether
that kernel's headers are installed, free disk at the install root, the node's Debian/Ubuntu
mirror, and every NVIDIA GPU visible through sysfs, /dev/nvidia*, /proc/driver/nvidia,
lspci and nvidia-smi. It changes nothing, needs only the standard library and runs on
Python 3.8+ (Ubuntu 20.04's, the oldest system Python of a supported distro), so the role can
run it with the node's own interpreter before anything is installed.

Why sysfs first: minimal images lack pciutils, but /sys/bus/pci always lists the devices; lspci
(when present) only adds the marketing name, and nvidia-smi (when a driver is loaded) adds the
authoritative name and compute capability. Every path is a flag so tests can point the probe
at a fake tree.
"""

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys

NVIDIA_VENDOR = "0x10de"
# PCI classes of GPUs: 0x0300 VGA compatible controller, 0x0302 3D controller. NVIDIA's audio
# and USB functions on the same card (0x0403, 0x0c03) are not GPUs.
GPU_CLASSES = ("0x0300", "0x0302")
SMI_FIELDS = ("name", "compute_cap", "driver_version", "memory.total", "pci.bus_id")


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def run(argv, timeout=20):
    """stdout of a command, or None when it is missing, fails or hangs."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def match_model(name, models):
    """The matrix key naming this GPU, or None.

    A key matches when each of its dash-separated tokens appears in the name as a token of its
    own: not glued to a letter or digit before it, and not followed by a digit (so "A10" does
    not match "A100" and "L4" does not match "L40S", while "80G" matches "80GB"). The longest
    matching key wins: "A100-80G" over "A100", "A10G" over "A10".
    """
    if not name:
        return None
    best = None
    for key in models:
        tokens = [t for t in key.split("-") if t]
        matches = bool(tokens) and all(
            re.search(r"(?<![A-Za-z0-9])" + re.escape(t) + r"(?![0-9])", name) for t in tokens
        )
        if matches and (best is None or len(key) > len(best)):
            best = key
    return best


def pci_gpus(sysfs_root):
    devices_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        addresses = sorted(os.listdir(devices_dir))
    except OSError:
        return []
    found = []
    for address in addresses:
        base = os.path.join(devices_dir, address)
        vendor = read_text(os.path.join(base, "vendor"))
        klass = read_text(os.path.join(base, "class")) or ""
        if vendor == NVIDIA_VENDOR and klass[:6] in GPU_CLASSES:
            found.append(
                {
                    "address": address,
                    "device_id": read_text(os.path.join(base, "device")),
                    "class": klass,
                    "name": None,
                }
            )
    return found


def lspci_name(address, lspci):
    """The device name from pci.ids, e.g. 'GH100 [H100 SXM5 80GB HBM3]'."""
    out = run([lspci, "-mm", "-s", address])
    if not out:
        return None
    fields = shlex.split(out.splitlines()[0])
    # -mm: slot, class, vendor, device, [-r rev] ...
    return fields[3] if len(fields) > 3 else None


def smi_gpus(nvidia_smi):
    """One dict per GPU from nvidia-smi; [] without a working driver.

    compute_cap is a query field only since driver 510-ish: ask without it when it is refused.
    """
    for fields in (SMI_FIELDS, tuple(f for f in SMI_FIELDS if f != "compute_cap")):
        out = run([nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
        if out is None:
            continue
        gpus = []
        for line in out.splitlines():
            if not line.strip():
                continue
            values = [v.strip() for v in line.split(",")]
            # zip(strict=) needs 3.10; the nodes may run 3.8.
            row = dict(zip(fields, values))  # noqa: B905
            gpus.append(
                {
                    "name": row.get("name"),
                    "compute_capability": row.get("compute_cap"),
                    "driver_version": row.get("driver_version"),
                    "memory_total_mib": row.get("memory.total"),
                    "bus_id": row.get("pci.bus_id"),
                }
            )
        return gpus
    return []


def free_disk(path):
    """Free bytes for unprivileged writers at `path` (or its nearest existing parent)."""
    checked = os.path.abspath(path)
    while not os.path.exists(checked) and checked != os.path.dirname(checked):
        checked = os.path.dirname(checked)
    stats = os.statvfs(checked)
    free = stats.f_bavail * stats.f_frsize
    return {
        "path": path,
        "checked_path": checked,
        "free_bytes": free,
        "free_gb": round(free / 1e9, 1),
    }


def debian_mirror(apt_root):
    """The first Debian/Ubuntu archive URI in the node's apt sources (deb822 or one-line)."""
    candidates = [os.path.join(apt_root, "sources.list")]
    parts = os.path.join(apt_root, "sources.list.d")
    with contextlib.suppress(OSError):
        candidates += [os.path.join(parts, n) for n in sorted(os.listdir(parts))]
    pattern = re.compile(r"^\s*(?:URIs:|deb)\s+(?:\[[^\]]*\]\s+)?((?:https?|file)://\S+)", re.M)
    for path in candidates:
        if not path.endswith((".list", ".sources")):
            continue
        for uri in pattern.findall(read_text(path) or ""):
            if re.search(r"/(debian|ubuntu)/?$", uri):
                return uri.rstrip("/")
    return None


def probe(args):
    models = [m for m in args.models.split(",") if m]
    gpus = pci_gpus(args.sysfs_root)
    lspci = shutil.which("lspci")
    for gpu in gpus:
        if lspci:
            gpu["name"] = lspci_name(gpu["address"], lspci)
        gpu["model"] = match_model(gpu["name"], models)

    nvidia_smi = shutil.which("nvidia-smi")
    smi = smi_gpus(nvidia_smi) if nvidia_smi else []
    for gpu in smi:
        gpu["model"] = match_model(gpu["name"], models)

    dev_files = (
        sorted(n for n in os.listdir(args.dev_root) if re.match(r"^nvidia[0-9]+$", n))
        if os.path.isdir(args.dev_root)
        else []
    )
    proc_version = read_text(os.path.join(args.proc_root, "driver", "nvidia", "version"))
    driver = re.search(
        r"Kernel Module\s+(?:for \S+\s+)?([0-9]+\.[0-9]+(?:\.[0-9]+)?)", proc_version or ""
    )

    kernel = args.kernel or platform.release()
    headers_dir = os.path.join(args.modules_root, kernel, "build")
    return {
        "python": {
            "version": "{}.{}".format(*sys.version_info[:2]),
            "full_version": platform.python_version(),
            "executable": sys.executable,
        },
        "kernel": {
            "release": kernel,
            "headers_dir": headers_dir,
            "headers_present": os.path.isdir(headers_dir),
        },
        "disk": free_disk(args.install_root),
        "apt_mirror": debian_mirror(args.apt_root),
        "gpu": {
            # A GPU is present when the bus shows one, or when a loaded driver exposes device
            # files (some virtualised GPUs hide their PCI identity).
            "present": bool(gpus or dev_files or smi),
            "pci": gpus,
            "device_files": ["/dev/" + n for n in dev_files],
            "driver_loaded_version": driver.group(1) if driver else None,
            "nvidia_smi": smi,
            "lspci_available": bool(lspci),
        },
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install-root", default="/opt")
    parser.add_argument("--models", default="", help="comma-separated GPU model keys")
    parser.add_argument("--kernel", default="", help="kernel release (default: running kernel)")
    parser.add_argument("--sysfs-root", default="/sys")
    parser.add_argument("--dev-root", default="/dev")
    parser.add_argument("--proc-root", default="/proc")
    parser.add_argument("--modules-root", default="/lib/modules")
    parser.add_argument("--apt-root", default="/etc/apt")
    json.dump(probe(parser.parse_args(argv)), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
