"""The rules of `torchfleet-runtime check`: a node's facts + the version matrix -> check rows.

Contract: `evaluate(facts, matrix, options)` is pure and returns (profile, [Check]); each Check
has a status (ok, warn, fail, skip), the value seen, what was expected and a hint that says what
to change. Every compatibility rule comes from `torchfleet_compat.matrix`, the module infra
and the preflight role judge with too; this module adds what only an installed node can show
(which torch imports, the wheel's arch list, the loaded driver, cuDNN, memory) and says, per
rule, whether a broken rule fails the node or only warns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from torchfleet_compat import matrix as compat
from torchfleet_compat.matrix import FAIL, OK, WARN, Matrix, Profile

from torchfleet_runtime.nodefacts import HostFacts, format_cudnn

SKIP = "skip"
STATUSES = (OK, WARN, FAIL, SKIP)

# torchfleet_runtime itself needs these; below them the runtime cannot run at all.
MIN_TORCH = "1.12"
# Below this much available memory a node swaps while loading even a small model
# (torch itself takes about 0.5 GiB resident).
LOW_MEMORY_BYTES = 1 << 30


class CheckError(Exception):
    """A usage problem (no matrix, bad profile): reported as one line, exit status 2."""


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
    verdict = compat.python_verdict(matrix, prof, facts.python_version)
    if compat.below_runtime_floor(facts.python_version):
        # below the runtime's own floor nothing serves: a failure, not a warning
        return Check(
            "python", FAIL, facts.python_version, f">= {compat.MIN_PYTHON}", verdict.reason
        )
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
    return (
        bool(prof.cuda and facts.torch_cuda)
        and compat.parse_version(prof.cuda)[:2] == compat.parse_version(str(facts.torch_cuda))[:2]
    )


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
            hint = (
                ""
                if status == OK
                else (
                    "add this GPU model to the matrix's gpus"
                    if not cc
                    else f"{verdict.reason}: {_fits('profile', verdict.profiles)}"
                )
            )
        elif not cc:
            status, value, hint = (
                WARN,
                "unknown compute capability",
                "add this GPU model to the matrix's gpus",
            )
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
    gpu = facts.gpu_present
    verdict = compat.disk_verdict(matrix, facts.disk_free_bytes or 0, override, gpu_stack=gpu)
    value = f"{(facts.disk_free_bytes or 0) / 1e9:.1f} GB free at {facts.disk_path}"
    expected = f">= {compat.min_free_disk(matrix, override, gpu):g} GB"
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


def summarize(checks: Sequence[Check]) -> dict[str, int]:
    return {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
