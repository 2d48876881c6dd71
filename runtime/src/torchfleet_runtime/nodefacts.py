"""What `torchfleet-runtime check` sees on a node: the only code of `check` that probes the host.

Contract: `gather_facts(disk_path)` returns a plain `HostFacts` (torch and its CUDA build, the
wheel's arch list, cuDNN, the NVIDIA driver through NVML, nvidia-smi or procfs, the GPUs,
/etc/os-release, free disk, /proc/meminfo). It judges nothing: the rules are nodechecks.py, the
report envcheck.py, so both can be tested without a GPU.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from torchfleet_compat import matrix as compat


@dataclass
class Gpu:
    index: int
    name: str
    compute_capability: str | None  # "9.0"; None when no probe could tell


@dataclass
class HostFacts:
    python_version: str
    torch_version: str | None = None  # None: torch does not import
    torch_error: str | None = None
    torch_cuda: str | None = None  # torch.version.cuda; None for a CPU build
    cuda_available: bool = False
    arch_list: list[str] = field(default_factory=list)
    cudnn_version: int | None = None
    driver_version: str | None = None
    driver_source: str | None = None  # nvml | nvidia-smi | procfs
    gpus: list[Gpu] = field(default_factory=list)
    disk_path: str = "/"
    disk_free_bytes: int | None = None
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    distro: str = ""  # the matrix's name for it (debian-12); '' without /etc/os-release

    @property
    def gpu_present(self) -> bool:
        return bool(self.driver_version or self.gpus or self.cuda_available)


def _probe_torch(facts: HostFacts) -> None:
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
                cap = torch.cuda.get_device_capability(i)
                facts.gpus.append(Gpu(i, torch.cuda.get_device_name(i), "{}.{}".format(*cap)))
    except Exception as exc:  # a driver/runtime mismatch surfaces here, e.g. error 803
        facts.torch_error = f"torch.cuda: {type(exc).__name__}: {exc}"


def _probe_nvml(facts: HostFacts) -> bool:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except Exception:  # library present, no driver
        return False
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        facts.driver_version = version.decode() if isinstance(version, bytes) else version
        facts.driver_source = "nvml"
        if not facts.gpus:
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                cap = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                facts.gpus.append(
                    Gpu(i, name.decode() if isinstance(name, bytes) else name, "{}.{}".format(*cap))
                )
        return True
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvidia_smi(query: str) -> list[str] | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=" + query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def _probe_nvidia_smi(facts: HostFacts) -> bool:
    lines = _nvidia_smi("driver_version")
    if not lines:
        return False
    facts.driver_version, facts.driver_source = lines[0], "nvidia-smi"
    if not facts.gpus:
        # compute_cap is known to nvidia-smi from driver 510 on; older ones print an error
        rows = _nvidia_smi("name,compute_cap") or []
        for i, row in enumerate(rows):
            name, _, cap = row.rpartition(",")
            ok_cap = re.match(r"^\d+\.\d+$", cap.strip())
            facts.gpus.append(Gpu(i, (name or row).strip(), cap.strip() if ok_cap else None))
    return True


def _probe_procfs(facts: HostFacts, path: str = "/proc/driver/nvidia/version") -> bool:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 ..."
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
    if not match:
        return False
    facts.driver_version, facts.driver_source = match.group(1), "procfs"
    return True


def format_cudnn(raw: int) -> str:
    """torch.backends.cudnn.version(): 8302 -> '8.3.2' (cuDNN 8), 90100 -> '9.1.0' (cuDNN 9+)."""
    if raw >= 10000:  # cuDNN 9 changed the encoding to major*10000 + minor*100 + patch
        return f"{raw // 10000}.{(raw % 10000) // 100}.{raw % 100}"
    return f"{raw // 1000}.{(raw % 1000) // 100}.{raw % 100}"


def read_meminfo(path: str = "/proc/meminfo") -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes; (None, None) where procfs has no meminfo."""
    values: dict[str, int] = {}
    try:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        return None, None
    return values.get("MemTotal"), values.get("MemAvailable")


def existing_ancestor(path: str) -> Path:
    """The disk a not-yet-created directory will live on: its nearest existing parent."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def gather_facts(disk_path: str) -> HostFacts:
    facts = HostFacts(python_version="{}.{}.{}".format(*sys.version_info[:3]))
    _probe_torch(facts)
    _probe_nvml(facts) or _probe_nvidia_smi(facts) or _probe_procfs(facts)
    where = existing_ancestor(disk_path)
    facts.disk_path = str(where)
    facts.disk_free_bytes = shutil.disk_usage(str(where)).free
    facts.mem_total_bytes, facts.mem_available_bytes = read_meminfo()
    facts.distro = compat.read_os_release()
    return facts
