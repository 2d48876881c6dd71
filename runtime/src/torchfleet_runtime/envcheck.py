"""`torchfleet-runtime check`: is this node able to serve a model on its GPU?

The checklist a person runs by hand on a fresh GPU node, as one command: Python and torch
against the CUDA profile of compat/matrix.yml, the NVIDIA driver against the minimum for
torch's CUDA, the GPU's compute capability against the wheel's arch list, cuDNN, free disk and
memory. Output is a table (or `--json`); the exit status is 1 when any check fails.

The module has three parts, so that the logic can be tested without a GPU:
- pure comparisons (`parse_version`, `version_at_least`, `torch_matches`, `arch_coverage`, ...);
- `gather_facts()`: the only code that probes the host (torch, NVML / nvidia-smi / procfs,
  statvfs, /proc/meminfo), returning a plain `HostFacts`;
- `evaluate(facts, matrix, options)`: facts + matrix -> a list of `Check` rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)

# torchfleet_runtime itself needs these; below them the runtime cannot run at all.
MIN_PYTHON = (3, 8)
MIN_TORCH = "1.12"
# Below this much available memory a node swaps while loading even a small model
# (torch itself takes about 0.5 GiB resident).
LOW_MEMORY_BYTES = 1 << 30

DEFAULT_DISK_PATH = "/var/lib/torchfleet"
ETC_MATRIX = "/etc/torchfleet/matrix.yml"


class CheckError(Exception):
    """A usage problem (no matrix, bad profile): reported as one line, exit status 2."""


# --------------------------------------------------------------------------- pure logic


def parse_version(text: str) -> tuple[int, ...]:
    """'535.104.05' -> (535, 104, 5); '1.12.1+cu116' -> (1, 12, 1); '2.1.0a0' -> (2, 1, 0).

    Only the leading dotted numbers count: local tags (+cu116) and pre-release suffixes are
    compared separately where they matter.
    """
    base = text.strip().split("+", 1)[0]
    parts = []
    for piece in base.split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.end() != len(piece):  # '0a0', '0rc1': stop after the number
            break
    if not parts:
        raise ValueError(f"not a version: {text!r}")
    return tuple(parts)


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def version_at_least(actual: str, minimum: str) -> bool:
    """Numeric comparison, so '535.54.03' >= '510.47.03' and '10.1' > '9.2'."""
    a, b = _padded(parse_version(actual), parse_version(minimum))
    return a >= b


def local_tag(version: str) -> str:
    """'1.12.1+cu116' -> 'cu116'; '2.13.0' -> ''."""
    return version.split("+", 1)[1] if "+" in version else ""


def torch_matches(installed: str, pinned: str) -> bool:
    """Same release, and the same build tag when the pin names one.

    The `cpu` profile pins '2.13.0' without a tag: both PyPI's '2.13.0' and the CPU index's
    '2.13.0+cpu' satisfy it. 'cu116' pins '1.12.1+cu116': a '+cu113' build does not.
    """
    a, b = _padded(parse_version(installed), parse_version(pinned))
    if a != b:
        return False
    return not local_tag(pinned) or local_tag(pinned) == local_tag(installed)


def python_in(version: str, allowed: Sequence[str]) -> bool:
    """'3.11.7' is in ['3.10', '3.11']: compare major.minor only."""
    return parse_version(version)[:2] in {parse_version(v)[:2] for v in allowed}


def format_cudnn(raw: int) -> str:
    """torch.backends.cudnn.version(): 8302 -> '8.3.2' (cuDNN 8), 90100 -> '9.1.0' (cuDNN 9+)."""
    if raw >= 10000:  # cuDNN 9 changed the encoding to major*10000 + minor*100 + patch
        return f"{raw // 10000}.{(raw % 10000) // 100}.{raw % 100}"
    return f"{raw // 1000}.{(raw % 1000) // 100}.{raw % 100}"


_ARCH_RE = re.compile(r"^(sm|compute)_(\d+)(\d)([a-z]?)$")


def arch_coverage(capability: str, arch_list: Sequence[str]) -> tuple[str, str]:
    """Does a wheel built for `arch_list` (torch.cuda.get_arch_list()) run on a GPU of
    compute capability `capability` ('8.6')? Returns (status, reason).

    ok:   an exact cubin (sm_86 / sm_86a), or PTX (compute_XY) of the same major at or below
          the GPU's minor, which the driver JIT-compiles on first use;
    warn: only a lower same-major cubin (sm_80 on an 8.6 GPU): NVIDIA's binary compatibility
          runs it, but kernels are not built for this GPU and the matrix does not vouch for it;
    fail: nothing of the GPU's major at or below its minor (e.g. only sm_86 for a 9.0 GPU).
    Arch-specific cubins (sm_90a) run on exactly that capability and never forward.
    """
    major, minor = parse_version(capability)[:2]
    exact, ptx, lower_cubin = [], [], []
    for entry in arch_list:
        match = _ARCH_RE.match(entry.strip())
        if not match:
            continue
        kind, e_major, e_minor, suffix = (
            match.group(1),
            int(match.group(2)),
            int(match.group(3)),
            match.group(4),
        )
        if e_major != major or e_minor > minor:
            continue
        if e_minor == minor and kind == "sm":
            exact.append(entry)
        elif kind == "compute" and not suffix:
            ptx.append(entry)
        elif kind == "sm" and not suffix:
            lower_cubin.append(entry)
    if exact:
        return OK, f"{exact[0]} in the wheel's arch list"
    if ptx:
        return OK, f"PTX {max(ptx)} is JIT-compiled for sm_{major}{minor} on first use"
    if lower_cubin:
        return (
            WARN,
            f"only {max(lower_cubin)} (runs by binary compatibility, not built for sm_{major}{minor})",
        )
    return FAIL, f"no sm_{major}x or compute_{major}x entry at or below sm_{major}{minor}"


# --------------------------------------------------------------------------- matrix


def find_matrix(explicit: str | None, env: dict[str, str] | None = None) -> Path:
    """--matrix, then $TORCHFLEET_MATRIX, then /etc/torchfleet/matrix.yml, then the
    checkout's compat/matrix.yml (walking up from this file). The first two must exist when
    given: a typo should not silently fall through to another matrix."""
    env = os.environ if env is None else env
    for source, value in (
        ("--matrix", explicit),
        ("TORCHFLEET_MATRIX", env.get("TORCHFLEET_MATRIX")),
    ):
        if value:
            path = Path(value)
            if not path.is_file():
                raise CheckError(f"{source} {value}: no such file")
            return path
    if Path(ETC_MATRIX).is_file():
        return Path(ETC_MATRIX)
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "compat" / "matrix.yml"
        if candidate.is_file():
            return candidate
    raise CheckError(
        "no version matrix found: pass --matrix FILE or set TORCHFLEET_MATRIX "
        f"(looked in {ETC_MATRIX} and the checkout's compat/matrix.yml)"
    )


def load_matrix(path: Path) -> dict[str, Any]:
    import yaml  # a runtime dependency; imported here so `--help` stays fast

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise CheckError(f"cannot read matrix {path}: {exc}") from exc
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("profiles"), dict)
        or not data["profiles"]
    ):
        raise CheckError(f"matrix {path}: expected a mapping with a non-empty 'profiles' mapping")
    return data


# --------------------------------------------------------------------------- facts


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
    return facts


# --------------------------------------------------------------------------- evaluation


@dataclass
class Check:
    name: str
    status: str
    value: str
    expected: str = ""
    hint: str = ""


@dataclass
class Options:
    profile: str | None = None  # None: pick the profile matching the installed torch
    min_free_disk_gb: float | None = None  # None: the matrix's min_free_disk_gb
    require_gpu: bool = False


def choose_profile(
    facts: HostFacts, matrix: dict[str, Any], requested: str | None
) -> tuple[str, str]:
    """(profile name, why). An explicit name must exist; otherwise the profile whose torch pin
    the installed torch satisfies, then the one with torch's CUDA, then default_profile."""
    profiles = matrix["profiles"]
    if requested:
        if requested not in profiles:
            raise CheckError(
                "--profile {!r} is not in the matrix; allowed: {}".format(
                    requested, ", ".join(profiles)
                )
            )
        return requested, "--profile"
    if facts.torch_version:
        for name, prof in profiles.items():
            if prof.get("torch") and torch_matches(facts.torch_version, str(prof["torch"])):
                return name, f"matches torch {facts.torch_version}"
        for name, prof in profiles.items():
            if (prof.get("cuda") or None) == facts.torch_cuda:
                return name, "matches torch's CUDA {}".format(
                    facts.torch_cuda or "(none: CPU build)"
                )
    default = matrix.get("default_profile")
    if default not in profiles:
        raise CheckError(
            "matrix default_profile {!r} is not one of: {}".format(default, ", ".join(profiles))
        )
    return default, "matrix default_profile"


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _check_python(facts: HostFacts, prof: dict[str, Any], name: str) -> Check:
    pythons = [str(p) for p in prof.get("pythons") or []]
    expected = "one of " + ", ".join(pythons) if pythons else "any"
    if parse_version(facts.python_version)[:2] < MIN_PYTHON:
        return Check(
            "python", FAIL, facts.python_version, ">= 3.8", "torchfleet-runtime needs Python 3.8+"
        )
    if pythons and not python_in(facts.python_version, pythons):
        return Check(
            "python",
            WARN,
            facts.python_version,
            expected,
            "profile {} publishes wheels for Python {} only".format(name, ", ".join(pythons)),
        )
    return Check("python", OK, facts.python_version, expected)


def _check_torch(
    facts: HostFacts, prof: dict[str, Any], name: str, require_gpu: bool
) -> list[Check]:
    pinned = str(prof.get("torch") or "")
    if facts.torch_version is None:
        return [
            Check(
                "torch",
                FAIL,
                "not importable",
                pinned or ">= " + MIN_TORCH,
                facts.torch_error or "install torch (the pytorch role pins it)",
            )
        ]
    checks = []
    if not version_at_least(facts.torch_version, MIN_TORCH):
        checks.append(
            Check(
                "torch",
                FAIL,
                facts.torch_version,
                ">= " + MIN_TORCH,
                "torchfleet-runtime supports torch 1.12 and newer",
            )
        )
    elif pinned and not torch_matches(facts.torch_version, pinned):
        checks.append(
            Check(
                "torch",
                WARN,
                facts.torch_version,
                pinned,
                f"profile {name} pins torch {pinned}; re-run the pytorch role",
            )
        )
    else:
        checks.append(Check("torch", OK, facts.torch_version, pinned or "any"))

    want_cuda = prof.get("cuda")
    have = facts.torch_cuda or "none (CPU build)"
    if want_cuda is None:
        status = OK if facts.torch_cuda is None or not facts.gpu_present else WARN
        checks.append(
            Check(
                "torch CUDA",
                status,
                have,
                "none (CPU profile)",
                "" if status == OK else "a GPU is present but the CPU profile is selected",
            )
        )
    elif facts.torch_cuda is None:
        status = FAIL if (facts.gpu_present or require_gpu) else WARN
        checks.append(
            Check(
                "torch CUDA",
                status,
                have,
                str(want_cuda),
                "this torch cannot use a GPU; install {} from {}".format(
                    pinned, prof.get("wheel_index")
                ),
            )
        )
    elif parse_version(facts.torch_cuda)[:2] != parse_version(str(want_cuda))[:2]:
        checks.append(
            Check(
                "torch CUDA",
                WARN,
                have,
                str(want_cuda),
                f"torch was built for CUDA {facts.torch_cuda}, profile {name} expects {want_cuda}",
            )
        )
    else:
        checks.append(Check("torch CUDA", OK, have, str(want_cuda)))
    if facts.torch_error and facts.torch_version:
        checks.append(
            Check(
                "torch.cuda",
                FAIL,
                facts.torch_error,
                "initialises",
                "often a driver too old for torch's CUDA, or a driver/library mismatch: reboot after a driver upgrade",
            )
        )
    return checks


def min_driver_for(cuda: str, matrix: dict[str, Any]) -> tuple[str | None, bool]:
    """(minimum driver, exact) for a CUDA version, from the matrix's profiles only.

    exact: a profile has this CUDA major.minor, so its min_driver is the documented minimum.
    Otherwise the highest min_driver among profiles of an older CUDA is a lower bound (a
    driver below it is certainly too old) but not a sufficient one.
    """
    want = parse_version(cuda)[:2]
    bound: str | None = None
    for prof in matrix["profiles"].values():
        if not prof.get("cuda") or not prof.get("min_driver"):
            continue
        have = parse_version(str(prof["cuda"]))[:2]
        if have == want:
            return str(prof["min_driver"]), True
        if have < want and (bound is None or version_at_least(str(prof["min_driver"]), bound)):
            bound = str(prof["min_driver"])
    return bound, False


def _check_driver(facts: HostFacts, prof: dict[str, Any], matrix: dict[str, Any]) -> Check:
    value = f"{facts.driver_version} (via {facts.driver_source})"
    # torch's own CUDA decides what the driver must support; the profile's when torch has none
    cuda = facts.torch_cuda or prof.get("cuda")
    if not cuda:
        return Check("nvidia driver", OK, value, "not needed (CPU build)")
    cuda = str(cuda)
    minimum, exact = min_driver_for(cuda, matrix)
    if facts.driver_version is None:
        return Check(
            "nvidia driver",
            FAIL,
            "not found",
            f">= {minimum}" if minimum else "a driver",
            "a GPU is listed but no driver version could be read",
        )
    if minimum and not version_at_least(facts.driver_version, minimum):
        return Check(
            "nvidia driver",
            FAIL,
            value,
            f">= {minimum} (CUDA {cuda})",
            f"CUDA {cuda} needs driver >= {minimum} (min_driver in the matrix); upgrade the "
            "driver (nvidia_driver role) or pick an older CUDA profile",
        )
    if not exact:
        return Check(
            "nvidia driver",
            WARN,
            value,
            f"a driver for CUDA {cuda}",
            f"compat/matrix.yml has no profile for CUDA {cuda}, so its minimum driver is not "
            "verified: add the profile with its min_driver",
        )
    return Check("nvidia driver", OK, value, f">= {minimum} (CUDA {cuda})")


def _gpu_capability(gpu: Gpu, matrix: dict[str, Any]) -> str | None:
    """The probe's capability, else the matrix's entry for a GPU whose name contains it."""
    if gpu.compute_capability:
        return gpu.compute_capability
    for model, info in sorted((matrix.get("gpus") or {}).items(), key=lambda kv: -len(kv[0])):
        if re.search(rf"\b{re.escape(model)}\b", gpu.name):
            return str(info.get("compute_capability"))
    return None


def _check_gpus(
    facts: HostFacts, prof: dict[str, Any], name: str, matrix: dict[str, Any]
) -> list[Check]:
    if not facts.gpus:
        return [
            Check(
                "gpu",
                FAIL,
                f"driver {facts.driver_version} but no GPU listed",
                "a GPU",
                "nvidia-smi lists no device: check `dmesg | grep -i nvrm`",
            )
        ]
    checks = []
    names = ", ".join(f"{g.index}: {g.name}" for g in facts.gpus)
    checks.append(Check("gpu", OK, names, "a GPU"))
    if not facts.arch_list and not prof.get("cuda"):
        # CPU torch under the CPU profile: "torch CUDA" already says the GPU goes unused
        checks.append(Check("gpu arch", SKIP, f"profile {name} has no CUDA", ""))
        return checks
    if facts.arch_list:
        arch_list, source = facts.arch_list, "torch.cuda.get_arch_list()"
    else:  # a CPU build of torch, or no torch: judge the wheel the profile would install
        arch_list = [
            "sm_" + str(c).replace(".", "") for c in prof.get("compute_capabilities") or []
        ]
        source = f"profile {name} compute_capabilities"
    describes_wheel = not facts.arch_list or (
        bool(prof.get("cuda"))
        and bool(facts.torch_cuda)
        and parse_version(str(prof["cuda"]))[:2] == parse_version(str(facts.torch_cuda))[:2]
    )
    seen = set()
    for gpu in facts.gpus:
        cap = _gpu_capability(gpu, matrix)
        if cap in seen:
            continue
        seen.add(cap)
        label = f"gpu arch ({gpu.name})"
        if cap is None:
            checks.append(
                Check(
                    label,
                    WARN,
                    "unknown compute capability",
                    source,
                    "add this GPU model to the matrix's gpus",
                )
            )
            continue
        status, reason = arch_coverage(cap, arch_list)
        value = "sm_{} ({})".format(cap.replace(".", ""), reason)
        hint = ""
        max_cc = prof.get("max_compute_capability")
        # The matrix's ceiling speaks for the profile's wheel; when torch is some other build,
        # its own arch list (judged above) is the better witness.
        if describes_wheel and max_cc and not version_at_least(str(max_cc), cap):
            status, value = FAIL, f"sm_{cap.replace('.', '')} (above profile {name}'s {max_cc})"
        if status != OK:
            fits = [
                p
                for p, d in matrix["profiles"].items()
                if cap in [str(c) for c in d.get("compute_capabilities") or []]
            ]
            hint = "profile {} reaches {}; use {}".format(
                name, max_cc or "no GPU", " or ".join(fits) if fits else "a newer CUDA profile"
            )
        checks.append(Check(label, status, value, "covered by " + source, hint))
    return checks


def _check_cudnn(facts: HostFacts) -> Check:
    if facts.torch_cuda is None:
        return Check("cudnn", SKIP, "CPU build of torch", "")
    if facts.cudnn_version is None:
        return Check(
            "cudnn",
            WARN,
            "unavailable",
            "bundled with the torch wheel",
            "torch.backends.cudnn.is_available() is False: convolutions run without cuDNN",
        )
    return Check("cudnn", OK, format_cudnn(facts.cudnn_version), "available")


def _check_disk(facts: HostFacts, minimum_gb: float) -> Check:
    free = facts.disk_free_bytes or 0
    value = f"{free / 1e9:.1f} GB free at {facts.disk_path}"
    expected = f">= {minimum_gb:g} GB"
    if free < minimum_gb * 1e9:
        return Check(
            "disk",
            FAIL,
            value,
            expected,
            f"driver, toolkit, wheels and models need {minimum_gb:g} GB: grow the volume",
        )
    return Check("disk", OK, value, expected)


def _check_memory(facts: HostFacts) -> Check:
    if facts.mem_total_bytes is None:
        return Check("memory", SKIP, "no /proc/meminfo", "")
    avail = (
        facts.mem_available_bytes
        if facts.mem_available_bytes is not None
        else facts.mem_total_bytes
    )
    value = f"{_gib(avail)} available of {_gib(facts.mem_total_bytes)}"
    if avail < LOW_MEMORY_BYTES:
        return Check(
            "memory",
            WARN,
            value,
            ">= 1.0 GiB available",
            "loading torch and a model needs about 1 GiB; stop other processes",
        )
    return Check("memory", OK, value, ">= 1.0 GiB available")


def evaluate(facts: HostFacts, matrix: dict[str, Any], options: Options) -> tuple[str, list[Check]]:
    """Pure: (chosen profile, checks) for these facts under this matrix."""
    name, why = choose_profile(facts, matrix, options.profile)
    prof = matrix["profiles"][name]
    checks = [Check("profile", OK, f"{name} ({why})", "a profile of the matrix")]
    checks.append(_check_python(facts, prof, name))
    checks.extend(_check_torch(facts, prof, name, options.require_gpu))
    if facts.gpu_present:
        checks.append(_check_driver(facts, prof, matrix))
        checks.extend(_check_gpus(facts, prof, name, matrix))
        checks.append(_check_cudnn(facts))
    else:
        status = FAIL if options.require_gpu else SKIP
        hint = "--require-gpu: no NVIDIA driver or device found" if options.require_gpu else ""
        for label in ("nvidia driver", "gpu", "cudnn"):
            checks.append(Check(label, status, "no NVIDIA GPU", "", hint))
    minimum = options.min_free_disk_gb
    if minimum is None:
        minimum = float(matrix.get("min_free_disk_gb", 20))
    checks.append(_check_disk(facts, minimum))
    checks.append(_check_memory(facts))
    return name, checks


# --------------------------------------------------------------------------- output + CLI


def render_table(checks: Sequence[Check]) -> str:
    headers = ("CHECK", "STATUS", "VALUE", "EXPECTED")
    rows = [(c.name, c.status.upper(), c.value, c.expected) for c in checks]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:3])]
    lines = []
    for row in [headers, *rows]:
        lines.append(
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3]
        )
    for c in checks:
        if c.hint and c.status in (WARN, FAIL):
            lines.append(f"{c.status.upper()}: {c.name}: {c.hint}")
    return "\n".join(line.rstrip() for line in lines)


def summarize(checks: Sequence[Check]) -> dict[str, int]:
    return {s: sum(1 for c in checks if c.status == s) for s in STATUSES}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "Check this node against the version matrix (exit 1 on a failed check)."
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--matrix",
        metavar="FILE",
        help=f"version matrix (default: $TORCHFLEET_MATRIX, {ETC_MATRIX}, the checkout's "
        "compat/matrix.yml)",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="CUDA profile to check against (default: the one matching the installed torch)",
    )
    parser.add_argument(
        "--min-free-disk-gb",
        type=float,
        metavar="N",
        help="free disk required at --path (default: the matrix's min_free_disk_gb)",
    )
    parser.add_argument(
        "--path",
        default=DEFAULT_DISK_PATH,
        help="where models live; its disk is checked (default: %(default)s)",
    )
    parser.add_argument(
        "--require-gpu",
        action="store_true",
        help="fail, instead of skip, the GPU checks on a host without a GPU",
    )


def run(args: argparse.Namespace) -> int:
    try:
        matrix_path = find_matrix(args.matrix)
        matrix = load_matrix(matrix_path)
        if args.min_free_disk_gb is not None and args.min_free_disk_gb < 0:
            raise CheckError(f"--min-free-disk-gb {args.min_free_disk_gb}: must be >= 0")
        facts = gather_facts(args.path)
        options = Options(
            profile=args.profile,
            min_free_disk_gb=args.min_free_disk_gb,
            require_gpu=args.require_gpu,
        )
        profile, checks = evaluate(facts, matrix, options)
    except CheckError as exc:
        print(f"torchfleet-runtime check: error: {exc}", file=sys.stderr)
        return 2
    counts = summarize(checks)
    if args.json:
        print(
            json.dumps(
                {
                    "matrix": str(matrix_path),
                    "profile": profile,
                    "ok": counts[FAIL] == 0,
                    "summary": counts,
                    "checks": [asdict(c) for c in checks],
                },
                indent=2,
            )
        )
    else:
        print(f"matrix: {matrix_path}")
        print(render_table(checks))
        print(", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if counts[FAIL] else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchfleet-runtime check")
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
