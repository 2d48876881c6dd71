"""What a node shows: the one probe of a host, read-only, standard library only.

Contract. `probe(...)` returns a plain `NodeFacts` and judges nothing (judge.py does). It is the
only code that looks at a host, for both entry points:
- the preflight role's module, before anything is installed (`installed=False`): the Python
  that runs it, /etc/os-release, free disk at the install root (an earlier install's trees count
  as room), the NVIDIA GPUs on the PCI bus (sysfs, named by lspci when present), /dev/nvidia*,
  the loaded driver (nvidia-smi, /proc/driver/nvidia), the running kernel's headers (installed,
  or offered by apt), the node's Debian/Ubuntu mirror;
- `torchfleet-runtime check` on an installed node (`installed=True`): the same, plus torch
  (imported here, lazily: its CUDA build, arch list, cuDNN, the GPUs it sees), the driver and
  GPUs through NVML when nvidia-ml-py is there, and /proc/meminfo.

Why sysfs first: minimal images lack pciutils, but /sys/bus/pci always lists the devices; lspci
only adds the marketing name, and a loaded driver adds the authoritative name and compute
capability. Every root is a parameter (`roots`), so tests point the probe at a fake tree.
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
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .matrix import match_gpu, read_os_release, tree_bytes

NVIDIA_VENDOR = "0x10de"
# PCI classes of GPUs: 0x0300 VGA compatible controller, 0x0302 3D controller. NVIDIA's audio
# and USB functions on the same card (0x0403, 0x0c03) are not GPUs.
GPU_CLASSES = ("0x0300", "0x0302")
SMI_FIELDS = ("name", "compute_cap", "driver_version", "memory.total", "pci.bus_id")
# Where the probe looks; tests point these at a fake tree. kernel '': the running kernel.
ROOTS = {
    "sysfs": "/sys",
    "dev": "/dev",
    "proc": "/proc",
    "modules": "/lib/modules",
    "apt": "/etc/apt",
    "apt_lists": "/var/lib/apt/lists",
    "os_release": "/etc/os-release",
    "meminfo": "/proc/meminfo",
    "kernel": "",
}
_DRIVER_RE = re.compile(r"Kernel Module\s+(?:for \S+\s+)?([0-9]+\.[0-9]+(?:\.[0-9]+)?)")


@dataclass
class Gpu:
    """One NVIDIA GPU as a probe saw it."""

    index: int
    name: str  # '' when nothing names it (sysfs without lspci)
    compute_capability: str | None  # "9.0" as a driver reports it; None when nothing tells
    model: str = ""  # the matrix key the name matches ('' for none)
    via: str = ""  # torch | nvml | nvidia-smi | lspci | sysfs
    device_id: str = ""  # the PCI device id (sysfs), to name a GPU the matrix does not know
    address: str = ""  # the PCI address (sysfs)
    memory_total_mib: str = ""  # nvidia-smi's memory.total
    driver_version: str | None = None  # nvidia-smi's, for the node's driver


@dataclass
class Disk:
    path: str  # where the install (or the models) will live
    checked_path: str  # its nearest existing parent: the filesystem measured
    free_bytes: int  # free for unprivileged writers
    reused_bytes: int = 0  # what an earlier install occupies there (a re-run replaces it)


@dataclass
class Kernel:
    release: str
    headers_dir: str
    headers_present: bool
    headers_offered: bool | None = None  # does apt offer them; None: not asked


@dataclass
class NodeFacts:
    python_version: str  # "3.11.7": the interpreter running the probe
    python_executable: str = ""
    distro: str = ""  # the matrix's name for it (debian-12); '' without /etc/os-release
    disk: Disk = field(default_factory=lambda: Disk("/", "/", 0))
    gpus: list[Gpu] = field(default_factory=list)  # as a driver lists them (torch, NVML, smi)
    pci: list[Gpu] = field(default_factory=list)  # NVIDIA GPUs on the PCI bus
    device_files: list[str] = field(default_factory=list)  # /dev/nvidia0 ...
    driver_version: str | None = None  # the loaded NVIDIA driver
    driver_source: str | None = None  # nvml | nvidia-smi | procfs
    lspci_available: bool = False
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    # before install (installed=False)
    kernel: Kernel | None = None
    apt_mirror: str | None = None
    apt_lists_present: bool = False
    # an installed node (installed=True)
    torch_version: str | None = None  # None: torch does not import (or was not probed)
    torch_error: str | None = None
    torch_cuda: str | None = None  # torch.version.cuda; None for a CPU build
    cuda_available: bool = False
    arch_list: list[str] = field(default_factory=list)
    cudnn_version: int | None = None

    @property
    def gpu_present(self) -> bool:
        """Any sign of an NVIDIA GPU: the bus shows one, a driver lists one or exposes device
        files (some virtualised GPUs hide their PCI identity), or torch sees CUDA."""
        return bool(
            self.pci or self.gpus or self.device_files or self.driver_version or self.cuda_available
        )

    @property
    def first_gpu(self) -> Gpu | None:
        """The GPU a driver names first, else the first on the bus."""
        seen = self.gpus or self.pci
        return seen[0] if seen else None


# --------------------------------------------------------------------------- helpers


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def run(argv: Sequence[str], timeout: int = 20) -> str | None:
    """stdout of a command, or None when it is missing, fails or hangs."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


# --------------------------------------------------------------------------- GPUs


def pci_gpus(sysfs_root: str, lspci: str | None, models: Iterable[str]) -> list[Gpu]:
    devices_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        addresses = sorted(os.listdir(devices_dir))
    except OSError:
        return []
    found: list[Gpu] = []
    for address in addresses:
        base = os.path.join(devices_dir, address)
        klass = read_text(os.path.join(base, "class")) or ""
        if read_text(os.path.join(base, "vendor")) != NVIDIA_VENDOR or klass[:6] not in GPU_CLASSES:
            continue
        name = lspci_name(address, lspci) if lspci else None
        found.append(
            Gpu(
                index=len(found),
                name=name or "",
                compute_capability=None,
                model=match_gpu(name, models) or "",
                via="lspci" if lspci else "sysfs",
                device_id=read_text(os.path.join(base, "device")) or "",
                address=address,
            )
        )
    return found


def lspci_name(address: str, lspci: str) -> str | None:
    """The device name from pci.ids, e.g. 'GH100 [H100 SXM5 80GB HBM3]'."""
    out = run([lspci, "-mm", "-s", address])
    if not out:
        return None
    fields = shlex.split(out.splitlines()[0])
    # -mm: slot, class, vendor, device, [-r rev] ...
    return fields[3] if len(fields) > 3 else None


def smi_gpus(nvidia_smi: str, models: Iterable[str]) -> list[Gpu]:
    """One Gpu per device from nvidia-smi (each with the driver version); [] without a working
    driver. compute_cap is a query field only since driver 510-ish: ask again without it."""
    for fields in (SMI_FIELDS, tuple(f for f in SMI_FIELDS if f != "compute_cap")):
        out = run([nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
        if out is None:
            continue
        gpus: list[Gpu] = []
        for line in out.splitlines():
            if not line.strip():
                continue
            # zip(strict=) needs 3.10; the nodes may run 3.8.
            row = dict(zip(fields, (v.strip() for v in line.split(","))))
            cap = row.get("compute_cap") or ""
            gpus.append(
                Gpu(
                    index=len(gpus),
                    name=row.get("name") or "",
                    compute_capability=cap if re.match(r"^\d+\.\d+$", cap) else None,
                    model=match_gpu(row.get("name"), models) or "",
                    via="nvidia-smi",
                    address=row.get("pci.bus_id") or "",
                    memory_total_mib=row.get("memory.total") or "",
                    driver_version=row.get("driver_version"),
                )
            )
        return gpus
    return []


def _probe_torch(facts: NodeFacts, models: Iterable[str]) -> None:
    try:
        import torch
    except Exception as exc:  # a broken install raises more than ImportError
        facts.torch_error = f"{type(exc).__name__}: {exc}"
        return
    facts.torch_version = torch.__version__.split("+git", 1)[0]
    facts.torch_cuda = getattr(torch.version, "cuda", None)
    if facts.torch_cuda is None:
        return
    try:
        facts.cuda_available = torch.cuda.is_available()
        facts.arch_list = list(torch.cuda.get_arch_list())
        if torch.backends.cudnn.is_available():
            facts.cudnn_version = torch.backends.cudnn.version()
        if facts.cuda_available:
            for i in range(torch.cuda.device_count()):
                name = torch.cuda.get_device_name(i)
                cap = "{}.{}".format(*torch.cuda.get_device_capability(i))
                facts.gpus.append(Gpu(i, name, cap, match_gpu(name, models) or "", "torch"))
    except Exception as exc:  # a driver/runtime mismatch surfaces here, e.g. error 803
        facts.torch_error = f"torch.cuda: {type(exc).__name__}: {exc}"


def _probe_nvml(facts: NodeFacts, models: Iterable[str]) -> bool:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except Exception:  # library present, no driver
        return False

    def text(value: object) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    try:
        facts.driver_version = text(pynvml.nvmlSystemGetDriverVersion())
        facts.driver_source = "nvml"
        if not facts.gpus:
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = text(pynvml.nvmlDeviceGetName(handle))
                cap = "{}.{}".format(*pynvml.nvmlDeviceGetCudaComputeCapability(handle))
                facts.gpus.append(Gpu(i, name, cap, match_gpu(name, models) or "", "nvml"))
        return True
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def procfs_driver(proc_root: str) -> str | None:
    """The loaded kernel module's version from /proc/driver/nvidia/version."""
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..."
    match = _DRIVER_RE.search(
        read_text(os.path.join(proc_root, "driver", "nvidia", "version")) or ""
    )
    return match.group(1) if match else None


def format_cudnn(raw: int) -> str:
    """torch.backends.cudnn.version(): 8302 -> '8.3.2' (cuDNN 8), 90100 -> '9.1.0' (cuDNN 9+)."""
    if raw >= 10000:  # cuDNN 9 changed the encoding to major*10000 + minor*100 + patch
        return f"{raw // 10000}.{(raw % 10000) // 100}.{raw % 100}"
    return f"{raw // 1000}.{(raw % 1000) // 100}.{raw % 100}"


# --------------------------------------------------------------------------- host


def disk_facts(path: str, reused_paths: Iterable[str] = ()) -> Disk:
    """Free bytes for unprivileged writers at `path` (or its nearest existing parent: the disk a
    not-yet-created directory will live on), and the bytes an earlier install occupies in
    `reused_paths` on that same filesystem."""
    checked = os.path.abspath(path)
    while not os.path.exists(checked) and checked != os.path.dirname(checked):
        checked = os.path.dirname(checked)
    stats = os.statvfs(checked)
    device = os.stat(checked).st_dev
    reused = sum(tree_bytes(tree, device) for tree in reused_paths)
    return Disk(path, checked, stats.f_bavail * stats.f_frsize, reused)


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes; (None, None) where procfs has no meminfo."""
    values = {}
    for line in (read_text(path) or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return values.get("MemTotal"), values.get("MemAvailable")


def debian_mirror(apt_root: str) -> str | None:
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


def headers_candidate(kernel: str) -> bool | None:
    """Does apt offer linux-headers-<kernel>? None when apt-cache is not there to ask."""
    apt_cache = shutil.which("apt-cache")
    if not apt_cache:
        return None
    out = run([apt_cache, "policy", "linux-headers-" + kernel], timeout=60) or ""
    return bool(re.search(r"Candidate:\s+[0-9]", out))


# --------------------------------------------------------------------------- the probe


def probe(
    disk_path: str,
    models: Iterable[str] = (),
    roots: Mapping[str, str] = ROOTS,
    installed: bool = False,
    reused_paths: Iterable[str] = (),
    ask_apt: bool = True,
) -> NodeFacts:
    """Everything the node shows. `models`: the matrix's GPU keys, to name what is found;
    `installed`: also import torch and ask NVML (an installed node), else look at the kernel
    headers and apt (a node about to be installed; `ask_apt`: ask apt-cache for headers)."""
    roots = dict(ROOTS, **roots)
    models = list(models)
    facts = NodeFacts(
        python_version=platform.python_version(),
        python_executable=sys.executable,
        distro=read_os_release(roots["os_release"]),
        disk=disk_facts(disk_path, reused_paths),
    )
    lspci = shutil.which("lspci")
    facts.lspci_available = bool(lspci)
    facts.pci = pci_gpus(roots["sysfs"], lspci, models)
    dev_root = roots["dev"]
    if os.path.isdir(dev_root):
        names = sorted(n for n in os.listdir(dev_root) if re.match(r"^nvidia[0-9]+$", n))
        facts.device_files = ["/dev/" + n for n in names]
    if installed:
        _probe_torch(facts, models)
    nvidia_smi = shutil.which("nvidia-smi")
    if not (installed and _probe_nvml(facts, models)):
        smi = smi_gpus(nvidia_smi, models) if nvidia_smi else []
        if smi:
            facts.driver_version = smi[0].driver_version
            facts.driver_source = "nvidia-smi"
            facts.gpus = facts.gpus or smi
    if facts.driver_version is None:
        facts.driver_version = procfs_driver(roots["proc"])
        facts.driver_source = "procfs" if facts.driver_version else None
    facts.mem_total_bytes, facts.mem_available_bytes = read_meminfo(roots["meminfo"])
    if not installed:
        release = roots["kernel"] or platform.release()
        headers_dir = os.path.join(roots["modules"], release, "build")
        present = os.path.isdir(headers_dir)
        facts.kernel = Kernel(
            release,
            headers_dir,
            present,
            # asked only where it matters: a GPU node without the headers installed
            headers_candidate(release) if ask_apt and facts.gpu_present and not present else None,
        )
        facts.apt_mirror = debian_mirror(roots["apt"])
        facts.apt_lists_present = bool(glob.glob(os.path.join(roots["apt_lists"], "*_Packages*")))
    return facts
