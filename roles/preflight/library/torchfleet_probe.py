#!/usr/bin/python
"""Probe a node (read-only) and judge it against the version matrix: the preflight role's module.

What it reads: the Python that runs it (the role runs it with `preflight_python_interpreter`,
the interpreter the node's virtualenv will be built from), the distro (/etc/os-release), the
running kernel and whether its headers are installed (or offered by apt), free disk at the
install root, the node's Debian/Ubuntu mirror, and every NVIDIA GPU visible through sysfs,
/dev/nvidia*, /proc/driver/nvidia, lspci and nvidia-smi. It changes nothing and needs only the
standard library, so it runs on Python 3.8+ before anything is installed.

What it decides: every verdict comes from `torchfleet_matrix` (torchfleet-compat's
compat/src/torchfleet_compat/matrix.py, which Ansible ships with this module as module_utils;
infra and `torchfleet-runtime check` import the same file). The role's YAML only acts on the result:
  facts     the torchfleet_* facts later roles read (documented in the role's README)
  problems  one sentence per refused check, saying what to change (empty: the node is fine)
  summary   one line describing the node
  packages  what the role should install or refresh before probing again (pciutils to name
            the GPU, fresh package lists to look for kernel headers)

Why sysfs first: minimal images lack pciutils, but /sys/bus/pci always lists the devices; lspci
(when present) only adds the marketing name, and nvidia-smi (when a driver is loaded) adds the
authoritative name and compute capability. Every path is an option so tests can point the
probe at a fake tree.
"""

from __future__ import annotations

import contextlib
import glob
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchfleet_matrix import (
    Matrix,
    MatrixError,
    disk_verdict,
    match_gpu,
    min_free_disk,
    node_verdicts,
    parse,
    read_os_release,
    resolve_gpu,
    tree_bytes,
)

DOCUMENTATION = r"""
module: torchfleet_probe
short_description: Probe a node and judge it against the torchfleet version matrix.
description: Read-only. See the module's docstring and roles/preflight/README.md.
options:
  matrix: {type: dict, required: true, description: The parsed compat/matrix.yml.}
  matrix_file: {type: str, default: compat/matrix.yml, description: Its path, for messages.}
  profile: {type: str, default: "", description: torchfleet_cuda_profile (empty - the default profile).}
  gpu_model: {type: str, default: "", description: The GPU model the inventory declares.}
  compute_capability: {type: str, default: "", description: Declared capability of an unlisted GPU.}
  install_root: {type: str, default: /opt, description: Where free disk is measured.}
  min_free_disk_gb: {type: float, description: Override of the matrix's min_free_disk_gb (0 disables).}
  reused_paths: {type: list, elements: str, default: [], description: An earlier install's trees (count as room).}
  gpu_stack_forced: {type: bool, default: false, description: Driver/toolkit forced without a GPU (disk floor).}
  check_python: {type: bool, default: true, description: Refuse a Python the profile lacks.}
  check_gpu: {type: bool, default: true, description: Refuse a GPU the profile cannot drive.}
  check_distro: {type: bool, default: true, description: Refuse a distro the matrix lacks.}
  check_kernel_headers: {type: bool, default: true, description: Refuse a GPU node without kernel headers.}
  check_gpu_model_match: {type: bool, default: true, description: Refuse a GPU other than the declared one.}
  install_pciutils: {type: bool, default: true, description: Ask for pciutils when lspci is missing on a GPU node.}
  kernel_upgrade_hint: {type: str, default: "", description: What to tell the user when no headers exist.}
  python_interpreter: {type: str, default: "", description: The interpreter's path, for messages.}
  roots:
    type: dict
    default: {}
    description: Test roots (sysfs, dev, proc, modules, apt, apt_lists, os_release, kernel).
"""

NVIDIA_VENDOR = "0x10de"
# PCI classes of GPUs: 0x0300 VGA compatible controller, 0x0302 3D controller. NVIDIA's audio
# and USB functions on the same card (0x0403, 0x0c03) are not GPUs.
GPU_CLASSES = ("0x0300", "0x0302")
SMI_FIELDS = ("name", "compute_cap", "driver_version", "memory.total", "pci.bus_id")
ROOTS = {
    "sysfs": "/sys",
    "dev": "/dev",
    "proc": "/proc",
    "modules": "/lib/modules",
    "apt": "/etc/apt",
    "apt_lists": "/var/lib/apt/lists",
    "os_release": "/etc/os-release",
    "kernel": "",  # the running kernel
}


# --------------------------------------------------------------------------- facts


def read_text(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def run(argv, timeout=20):
    """stdout of a command, or None when it is missing, fails or hangs."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


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
            row = dict(zip(fields, values))
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


def free_disk(path, reused_paths=()):
    """Free bytes for unprivileged writers at `path` (or its nearest existing parent), and the
    bytes an earlier install occupies in `reused_paths` on that same filesystem."""
    checked = os.path.abspath(path)
    while not os.path.exists(checked) and checked != os.path.dirname(checked):
        checked = os.path.dirname(checked)
    stats = os.statvfs(checked)
    free = stats.f_bavail * stats.f_frsize
    device = os.stat(checked).st_dev
    reused = sum(tree_bytes(tree, device) for tree in reused_paths)
    return {
        "path": path,
        "checked_path": checked,
        "free_bytes": free,
        "free_gb": round(free / 1e9, 1),
        "reused_bytes": reused,
        "reused_gb": round(reused / 1e9, 1),
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


def headers_candidate(kernel):
    """Does apt offer linux-headers-<kernel>? None when apt-cache is not there to ask."""
    apt_cache = shutil.which("apt-cache")
    if not apt_cache:
        return None
    out = run([apt_cache, "policy", "linux-headers-" + kernel], timeout=60) or ""
    return bool(re.search(r"Candidate:\s+[0-9]", out))


def probe(roots, install_root, models, ask_apt, reused_paths=()):
    """Everything the node shows, as plain data (the role prints it with -v)."""
    gpus = pci_gpus(roots["sysfs"])
    lspci = shutil.which("lspci")
    for gpu in gpus:
        if lspci:
            gpu["name"] = lspci_name(gpu["address"], lspci)
        gpu["model"] = match_gpu(gpu["name"], models)
    nvidia_smi = shutil.which("nvidia-smi")
    smi = smi_gpus(nvidia_smi) if nvidia_smi else []
    for gpu in smi:
        gpu["model"] = match_gpu(gpu["name"], models)
    dev_root = roots["dev"]
    dev_files = (
        sorted(n for n in os.listdir(dev_root) if re.match(r"^nvidia[0-9]+$", n))
        if os.path.isdir(dev_root)
        else []
    )
    proc_version = read_text(os.path.join(roots["proc"], "driver", "nvidia", "version"))
    driver = re.search(
        r"Kernel Module\s+(?:for \S+\s+)?([0-9]+\.[0-9]+(?:\.[0-9]+)?)", proc_version or ""
    )
    kernel = roots["kernel"] or platform.release()
    headers_dir = os.path.join(roots["modules"], kernel, "build")
    present = bool(gpus or dev_files or smi)
    headers = os.path.isdir(headers_dir)
    return {
        "python": {
            "version": "{}.{}".format(*sys.version_info[:2]),
            "full_version": platform.python_version(),
            "executable": sys.executable,
        },
        "distro": read_os_release(roots["os_release"]),
        "kernel": {
            "release": kernel,
            "headers_dir": headers_dir,
            "headers_present": headers,
            # asked only where it matters: a GPU node without the headers installed
            "headers_offered": headers_candidate(kernel)
            if ask_apt and present and not headers
            else None,
        },
        "disk": free_disk(install_root, reused_paths),
        "apt_mirror": debian_mirror(roots["apt"]),
        "apt_lists_present": bool(glob.glob(os.path.join(roots["apt_lists"], "*_Packages*"))),
        "gpu": {
            # A GPU is present when the bus shows one, or when a loaded driver exposes device
            # files (some virtualised GPUs hide their PCI identity).
            "present": present,
            "pci": gpus,
            "device_files": ["/dev/" + n for n in dev_files],
            "driver_loaded_version": driver.group(1) if driver else None,
            "nvidia_smi": smi,
            "lspci_available": bool(lspci),
        },
    }


# --------------------------------------------------------------------------- verdicts


def check_inputs(matrix, params):
    """The role's inputs, each named with what is allowed (all problems at once)."""
    problems = []
    if params["profile"] and params["profile"] not in matrix.profiles:
        problems.append(
            "torchfleet_cuda_profile={} is not a profile of {}; allowed: {}".format(
                params["profile"], matrix.source, ", ".join(matrix.profiles)
            )
        )
    if params["gpu_model"] and params["gpu_model"] not in matrix.gpus:
        problems.append(
            "torchfleet_gpu_model={} is not in the matrix gpus; allowed: {} (or leave it unset "
            "and set torchfleet_compute_capability for another GPU)".format(
                params["gpu_model"], ", ".join(matrix.gpus)
            )
        )
    if params["compute_capability"] and not re.match(
        r"^[0-9]+\.[0-9]+$", params["compute_capability"]
    ):
        problems.append(
            "torchfleet_compute_capability={} is not a compute capability; allowed: MAJOR.MINOR "
            'in quotes, e.g. "8.6"'.format(params["compute_capability"])
        )
    if params["min_free_disk_gb"] is not None and params["min_free_disk_gb"] < 0:
        problems.append(
            "preflight_min_free_disk_gb={} is invalid; allowed: a number of GB >= 0 (0 disables "
            "the check), or null for the matrix's {:g}".format(
                params["min_free_disk_gb"], matrix.min_free_disk_gb
            )
        )
    if not params["install_root"].startswith("/"):
        problems.append(
            "preflight_install_root={} is invalid; allowed: an absolute path".format(
                params["install_root"]
            )
        )
    return problems


def _detected(facts):
    """(name, model, capability, via) of the first GPU the probe sees."""
    gpu = facts["gpu"]
    if gpu["nvidia_smi"]:
        first, via = gpu["nvidia_smi"][0], "nvidia-smi"
    elif gpu["pci"]:
        first, via = gpu["pci"][0], "lspci" if gpu["lspci_available"] else "sysfs"
    else:
        first, via = {}, "device files"
    return (
        first.get("name") or "",
        first.get("model") or "",
        first.get("compute_capability") or "",
        via,
    )


def _either(choices, fallback):
    return " or ".join(choices) if choices else fallback


def judge(matrix: Matrix, facts, params):
    """facts + the role's settings -> the module's result (facts, problems, summary, packages)."""
    profile = matrix.profile(params["profile"], "torchfleet_cuda_profile")
    name, detected, smi_cc, via = _detected(facts)
    declared = params["gpu_model"]
    gpu_present = facts["gpu"]["present"]
    who = resolve_gpu(
        matrix,
        name=name,
        reported_cc=smi_cc,
        declared_model=declared,
        declared_cc=params["compute_capability"],
    )
    # The GPU rule runs on a node that has a GPU or declares one (so a refusal can be shown on
    # any node: -e torchfleet_gpu_model=H100).
    judged_gpu = who if (gpu_present or who.model or who.compute_capability) else None
    python = facts["python"]["version"]
    distro = facts["distro"]
    problems = []
    for verdict in node_verdicts(matrix, profile, distro, python, judged_gpu):
        if verdict.ok or not params["check_" + verdict.rule]:
            continue
        if verdict.rule == "distro":
            problems.append(
                verdict.reason + ": use one of those images, or set "
                "preflight_check_distro=false to try anyway"
            )
        elif verdict.rule == "python":
            problems.append(
                "{} on this node ({}): set torchfleet_cuda_profile to {}, or run a distro whose "
                "Python {} supports ({})".format(
                    verdict.reason,
                    params["python_interpreter"] or facts["python"]["executable"],
                    _either(verdict.profiles, "a profile that supports it"),
                    profile.name,
                    ", ".join(verdict.distros) or "none listed",
                )
            )
        elif who.compute_capability:
            problems.append(
                "{}: set torchfleet_cuda_profile to {}".format(
                    verdict.reason,
                    _either(verdict.profiles, "a newer profile (none in the matrix fits)"),
                )
            )
        else:
            pci = facts["gpu"]["pci"]
            problems.append(
                '{} (PCI {}): set torchfleet_compute_capability (e.g. "8.6") or add the model to '
                "compat/matrix.yml `gpus`".format(
                    verdict.reason, pci[0]["device_id"] if pci else "?"
                )
            )
    if params["check_gpu_model_match"] and detected and declared and detected != declared:
        problems.append(
            f"the inventory declares torchfleet_gpu_model={declared} but this node has {detected} ({via}): fix the "
            "inventory (or infra's instance type), or set preflight_check_gpu_model_match=false"
        )
    disk = facts["disk"]
    # the driver and toolkit land where a GPU is, or where a bake forces them
    gpu_stack = bool(gpu_present or params["gpu_stack_forced"])
    verdict = disk_verdict(
        matrix, disk["free_bytes"], params["min_free_disk_gb"], disk["reused_bytes"], gpu_stack
    )
    if not verdict.ok:
        problems.append(
            "{} at {} (filesystem of {}): grow the disk, or lower preflight_min_free_disk_gb (0 "
            "disables the check)".format(
                verdict.reason, params["install_root"], disk["checked_path"]
            )
        )
    kernel = facts["kernel"]
    if (
        params["check_kernel_headers"]
        and gpu_present
        and not kernel["headers_present"]
        and kernel["headers_offered"] is False
    ):
        problems.append(
            "no headers for the running kernel {0}: linux-headers-{0} is neither installed nor "
            "offered by apt, so DKMS cannot build the driver: {1}, then rerun; or set "
            "preflight_check_kernel_headers=false if the driver comes prebuilt".format(
                kernel["release"],
                params["kernel_upgrade_hint"] or "install the current kernel and its headers",
            )
        )

    gpu = facts["gpu"]
    count = max(len(gpu["nvidia_smi"]), len(gpu["pci"]), len(gpu["device_files"]))
    distro_entry = matrix.distros.get(distro)
    published = {
        "torchfleet_cuda_profile": profile.name,
        "torchfleet_profile": profile.as_dict(),
        "torchfleet_distro": distro,
        "torchfleet_python_version": python,
        "torchfleet_gpu_present": gpu_present,
        "torchfleet_gpu_count": count,
        "torchfleet_gpu_model": who.model,
        "torchfleet_compute_capability": who.compute_capability,
        "torchfleet_nvidia_driver_loaded": gpu["driver_loaded_version"] or "",
        "torchfleet_apt_mirror": facts["apt_mirror"] or "",
        # where the NVIDIA packages come from on this distro (the driver and cuda roles' input)
        "torchfleet_cuda_repo": distro_entry.cuda_repo if distro_entry else "",
        "torchfleet_driver_source": distro_entry.driver_source if distro_entry else "distro",
        "torchfleet_toolkit_from_repo": matrix.toolkit_from_repo(profile, distro),
    }
    if gpu_present:
        gpu_text = "{} x {} (compute {}, via {}, {})".format(
            count,
            who.model or name or "unknown",
            who.compute_capability or "?",
            via,
            "driver " + gpu["driver_loaded_version"]
            if gpu["driver_loaded_version"]
            else "no driver loaded",
        )
    else:
        gpu_text = "none detected{}: driver and toolkit steps will be skipped unless forced".format(
            f" (declared {who.model})" if who.model else ""
        )
    summary = (
        "{}, Python {}, profile {} (torch {}), GPU: {}, {} GB free{} at {}, {} problem(s)".format(
            distro,
            python,
            profile.name,
            profile.torch,
            gpu_text,
            disk["free_gb"],
            " (+{} GB installed)".format(disk["reused_gb"]) if disk["reused_bytes"] else "",
            params["install_root"],
            len(problems),
        )
    )
    packages = {
        "pciutils": bool(params["install_pciutils"] and gpu["pci"] and not gpu["lspci_available"]),
        "refresh_lists": bool(
            params["check_kernel_headers"]
            and gpu_present
            and not kernel["headers_present"]
            and not kernel["headers_offered"]
        ),
        "cache_valid_time": 3600 if facts["apt_lists_present"] else 0,
    }
    return {
        "facts": published,
        "problems": problems,
        "summary": summary,
        "packages": packages,
        "probe": facts,
        "min_free_disk_gb": min_free_disk(matrix, params["min_free_disk_gb"], gpu_stack),
        "rules": {v.rule: v.ok for v in node_verdicts(matrix, profile, distro, python, judged_gpu)},
    }


ARGUMENTS = {
    "matrix": {"type": "dict", "required": True},
    "matrix_file": {"type": "str", "default": "compat/matrix.yml"},
    "profile": {"type": "str", "default": ""},
    "gpu_model": {"type": "str", "default": ""},
    "compute_capability": {"type": "str", "default": ""},
    "install_root": {"type": "str", "default": "/opt"},
    "min_free_disk_gb": {"type": "float"},
    "reused_paths": {"type": "list", "elements": "str", "default": []},
    "gpu_stack_forced": {"type": "bool", "default": False},
    "check_python": {"type": "bool", "default": True},
    "check_gpu": {"type": "bool", "default": True},
    "check_distro": {"type": "bool", "default": True},
    "check_kernel_headers": {"type": "bool", "default": True},
    "check_gpu_model_match": {"type": "bool", "default": True},
    "install_pciutils": {"type": "bool", "default": True},
    "kernel_upgrade_hint": {"type": "str", "default": ""},
    "python_interpreter": {"type": "str", "default": ""},
    "roots": {"type": "dict", "default": {}},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENTS, supports_check_mode=True)
    params = module.params
    try:
        matrix = parse(params["matrix"], params["matrix_file"])
    except MatrixError as exc:
        module.fail_json(
            msg="{} is not a torchfleet version matrix:\n{}".format(params["matrix_file"], exc)
        )
    problems = check_inputs(matrix, params)
    if problems:
        module.fail_json(
            msg="preflight: " + " ".join(f"({i}) {p}." for i, p in enumerate(problems, 1))
        )
    unknown = sorted(set(params["roots"]) - set(ROOTS))
    if unknown:
        module.fail_json(
            msg="roots: unknown keys {}; allowed: {}".format(", ".join(unknown), ", ".join(ROOTS))
        )
    roots = dict(ROOTS, **params["roots"])
    facts = probe(roots, params["install_root"], list(matrix.gpus), True, params["reused_paths"])
    module.exit_json(changed=False, **judge(matrix, facts, params))


if __name__ == "__main__":
    main()
