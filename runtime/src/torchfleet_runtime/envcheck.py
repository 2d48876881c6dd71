"""`torchfleet-runtime check`: is this node able to serve a model on its GPU?

The checklist a person runs by hand on a fresh GPU node, as one command: the distro, Python and
torch against the CUDA profile of compat/matrix.yml, the NVIDIA driver against the minimum for
torch's CUDA, the GPU against the profile, cuDNN, free disk and memory. Output is a table (or
`--json`); the exit status is 1 when any check fails.

Every compatibility rule comes from `torchfleet_runtime.matrix`, the module infra and the
preflight role judge with too; this module adds what only an installed node can show (which
torch imports, the wheel's arch list, the loaded driver, cuDNN, memory). Three parts, so that
the logic can be tested without a GPU:
- `gather_facts()`: the only code that probes the host (torch, NVML / nvidia-smi / procfs,
  /etc/os-release, statvfs, /proc/meminfo), returning a plain `HostFacts`;
- `evaluate(facts, matrix, options)`: facts + matrix -> a list of `Check` rows;
- the report: a table or JSON, and the CLI.
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
from typing import Sequence

from torchfleet_runtime import matrix as compat
from torchfleet_runtime.matrix import FAIL, OK, WARN, Matrix, Profile

SKIP = "skip"
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


def load_matrix(path: Path) -> Matrix:
    try:
        return compat.read(str(path))
    except compat.MatrixError as exc:
        raise CheckError(str(exc)) from exc


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


def choose_profile(facts: HostFacts, matrix: Matrix, requested: str | None) -> tuple[str, str]:
    """(profile name, why). An explicit name must exist; otherwise the profile whose torch pin
    the installed torch satisfies, then the one with torch's CUDA, then default_profile."""
    if requested:
        try:
            return matrix.profile(requested, "--profile").name, "--profile"
        except compat.MatrixError as exc:
            raise CheckError(str(exc)) from exc
    if facts.torch_version:
        for prof in matrix.profiles.values():
            if compat.torch_matches(facts.torch_version, prof.torch):
                return prof.name, f"matches torch {facts.torch_version}"
        for prof in matrix.profiles.values():
            if prof.cuda == facts.torch_cuda:
                return prof.name, "matches torch's CUDA {}".format(
                    facts.torch_cuda or "(none: CPU build)"
                )
    return matrix.default_profile, "matrix default_profile"


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _fits(what: str, names: Sequence[str]) -> str:
    return f"use {what} {' or '.join(names)}" if names else f"no {what} of the matrix fits"


def _check_distro(facts: HostFacts, matrix: Matrix) -> Check:
    if not facts.distro:
        return Check("distro", SKIP, "no /etc/os-release", "")
    verdict = compat.distro_verdict(matrix, facts.distro)
    if verdict.ok:
        return Check("distro", OK, facts.distro, "a distro of the matrix")
    # torch imports or not whatever the distro: a warning, the roles are what need the matrix
    return Check("distro", WARN, facts.distro, "a distro of the matrix", verdict.reason)


def _check_python(facts: HostFacts, matrix: Matrix, prof: Profile) -> Check:
    expected = "one of " + ", ".join(prof.pythons)
    if compat.parse_version(facts.python_version)[:2] < MIN_PYTHON:
        return Check(
            "python", FAIL, facts.python_version, ">= 3.8", "torchfleet-runtime needs Python 3.8+"
        )
    verdict = compat.python_verdict(matrix, prof, facts.python_version)
    if not verdict.ok:
        # a warning here: the torch that imports (checked next) is the better witness
        return Check(
            "python",
            WARN,
            facts.python_version,
            expected,
            f"{verdict.reason}: {_fits('profile', verdict.profiles)}",
        )
    return Check("python", OK, facts.python_version, expected)


def _check_torch(facts: HostFacts, prof: Profile, require_gpu: bool) -> list[Check]:
    pinned, name = prof.torch, prof.name
    if facts.torch_version is None:
        return [
            Check(
                "torch",
                FAIL,
                "not importable",
                pinned,
                facts.torch_error or "install torch (the pytorch role pins it)",
            )
        ]
    checks = []
    if not compat.version_at_least(facts.torch_version, MIN_TORCH):
        checks.append(
            Check(
                "torch",
                FAIL,
                facts.torch_version,
                ">= " + MIN_TORCH,
                "torchfleet-runtime supports torch 1.12 and newer",
            )
        )
    elif not compat.torch_matches(facts.torch_version, pinned):
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
        checks.append(Check("torch", OK, facts.torch_version, pinned))

    have = facts.torch_cuda or "none (CPU build)"
    if prof.cuda is None:
        # a GPU under the CPU profile is the gpu rule's verdict (below), not torch's
        checks.append(Check("torch CUDA", OK, have, "none (CPU profile)"))
    elif facts.torch_cuda is None:
        status = FAIL if (facts.gpu_present or require_gpu) else WARN
        checks.append(
            Check(
                "torch CUDA",
                status,
                have,
                prof.cuda,
                f"this torch cannot use a GPU; install {pinned} from {prof.wheel_index}",
            )
        )
    elif compat.parse_version(facts.torch_cuda)[:2] != compat.parse_version(prof.cuda)[:2]:
        checks.append(
            Check(
                "torch CUDA",
                WARN,
                have,
                prof.cuda,
                f"torch was built for CUDA {facts.torch_cuda}, profile {name} expects {prof.cuda}",
            )
        )
    else:
        checks.append(Check("torch CUDA", OK, have, prof.cuda))
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


def _check_driver(facts: HostFacts, prof: Profile, matrix: Matrix) -> Check:
    value = f"{facts.driver_version} (via {facts.driver_source})"
    # torch's own CUDA decides what the driver must support; the profile's when torch has none
    cuda = facts.torch_cuda or prof.cuda
    if not cuda:
        return Check("nvidia driver", OK, value, "not needed (CPU build)")
    if facts.driver_version is None:
        minimum, _ = compat.min_driver_for(matrix, cuda)
        return Check(
            "nvidia driver",
            FAIL,
            "not found",
            f">= {minimum}" if minimum else "a driver",
            "a GPU is listed but no driver version could be read",
        )
    status, reason, minimum = compat.driver_verdict(matrix, cuda, facts.driver_version)
    expected = f">= {minimum} (CUDA {cuda})" if minimum else f"a driver for CUDA {cuda}"
    if status == FAIL:
        reason += ": upgrade the driver (nvidia_driver role) or pick an older CUDA profile"
    elif status == WARN:
        reason += ": add the profile with its min_driver"
    return Check("nvidia driver", status, value, expected, "" if status == OK else reason)


def _describes_wheel(facts: HostFacts, prof: Profile) -> bool:
    """Is the installed torch (or, without a CUDA torch, the one to be installed) the build the
    profile describes? Then the matrix's rule judges the GPU; otherwise the wheel's own arch
    list is the witness."""
    if not facts.arch_list:
        return True
    return bool(prof.cuda and facts.torch_cuda) and compat.parse_version(prof.cuda)[
        :2
    ] == compat.parse_version(str(facts.torch_cuda))[:2]


def _check_gpus(facts: HostFacts, prof: Profile, matrix: Matrix) -> list[Check]:
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
    checks = [Check("gpu", OK, ", ".join(f"{g.index}: {g.name}" for g in facts.gpus), "a GPU")]
    matrix_rule = _describes_wheel(facts, prof)
    expected = f"driven by profile {prof.name}" if matrix_rule else "in torch.cuda.get_arch_list()"
    seen = set()
    for gpu in facts.gpus:
        who = compat.resolve_gpu(matrix, name=gpu.name, reported_cc=gpu.compute_capability)
        if who.compute_capability in seen:
            continue
        seen.add(who.compute_capability)
        label = f"gpu arch ({gpu.name})"
        cc = who.compute_capability
        if matrix_rule:
            verdict = compat.gpu_verdict(matrix, prof, who)
            status = OK if verdict.ok else (WARN if not cc else FAIL)
            value = ("sm_{}: ".format(cc.replace(".", "")) if cc else "") + verdict.reason
            if verdict.ok and facts.arch_list:  # the wheel's list can still prove it wrong
                covered, why = compat.arch_coverage(cc, facts.arch_list)
                if covered == FAIL:
                    status, value = FAIL, f"{value}, but the wheel has {why}"
            hint = "" if status == OK else (
                "add this GPU model to the matrix's gpus" if not cc
                else f"{verdict.reason}: {_fits('profile', verdict.profiles)}"
            )
        elif not cc:
            status, value, hint = WARN, "unknown compute capability", "add this GPU model to the matrix's gpus"
        else:
            status, why = compat.arch_coverage(cc, facts.arch_list)
            value = "sm_{} ({})".format(cc.replace(".", ""), why)
            hint = "" if status == OK else _fits("profile", matrix.profiles_for(cc))
        checks.append(Check(label, status, value, expected, hint))
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


def _check_disk(facts: HostFacts, matrix: Matrix, override: float | None) -> Check:
    verdict = compat.disk_verdict(matrix, facts.disk_free_bytes or 0, override)
    value = f"{(facts.disk_free_bytes or 0) / 1e9:.1f} GB free at {facts.disk_path}"
    expected = f">= {compat.min_free_disk(matrix, override):g} GB"
    if not verdict.ok:
        return Check("disk", FAIL, value, expected, verdict.reason + ": grow the volume")
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


def evaluate(facts: HostFacts, matrix: Matrix, options: Options) -> tuple[str, list[Check]]:
    """Pure: (chosen profile, checks) for these facts under this matrix."""
    name, why = choose_profile(facts, matrix, options.profile)
    prof = matrix.profiles[name]
    checks = [Check("profile", OK, f"{name} ({why})", "a profile of the matrix")]
    checks.append(_check_distro(facts, matrix))
    checks.append(_check_python(facts, matrix, prof))
    checks.extend(_check_torch(facts, prof, options.require_gpu))
    if facts.gpu_present:
        checks.append(_check_driver(facts, prof, matrix))
        checks.extend(_check_gpus(facts, prof, matrix))
        checks.append(_check_cudnn(facts))
    else:
        status = FAIL if options.require_gpu else SKIP
        hint = "--require-gpu: no NVIDIA driver or device found" if options.require_gpu else ""
        for label in ("nvidia driver", "gpu", "cudnn"):
            checks.append(Check(label, status, "no NVIDIA GPU", "", hint))
    checks.append(_check_disk(facts, matrix, options.min_free_disk_gb))
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
