"""The one judge: a node's facts + the version matrix -> checks, for the preflight and `check`.

Contract: `judge(facts, matrix, options)` is pure and returns (profile, [Check]). Both entry
points call it: the preflight role's module on a node about to be installed
(`Options(installed=False)`), `torchfleet-runtime check` on an installed one (the default).
Every compatibility rule comes from matrix.py (infra judges stacks with the same rules); this
module decides, per rule and stage, whether a broken rule fails the node or only warns, and adds
what only an installed node can show (which torch imports, the wheel's arch list, the loaded
driver, cuDNN, memory) or only a bare one matters for (kernel headers for DKMS).

Each Check has a status (ok, warn, fail, skip), the value seen, what was expected and a hint
that says what to change; `rule` names the matrix rule a row reports (distro, python, gpu,
disk, kernel_headers, gpu_model_match) and `verdict` carries that rule's reason and the
choices that would satisfy it, so an entry point can name the fix in its own words (a role
variable, a CLI flag). A distro past its standard support is a warning row of rule `support`.
Stage rules: before install the distro and Python decide whether the
roles can install at all (fail); after install the torch that imports is the better witness
(warn). A rule in `Options.waived` is reported as a warning, never a failure.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import matrix as compat
from .matrix import FAIL, OK, WARN, Matrix, Profile, Verdict
from .probe import Gpu, NodeFacts, format_cudnn

SKIP = "skip"
STATUSES = (OK, WARN, FAIL, SKIP)
# Rules beyond the matrix's own (distro, python, gpu, disk) that a bare node is judged by.
KERNEL_HEADERS, GPU_MODEL_MATCH = "kernel_headers", "gpu_model_match"

# torchfleet_runtime itself needs these; below them the runtime cannot run at all.
MIN_TORCH = "1.12"
# Below this much available memory a node swaps while loading even a small model
# (torch itself takes about 0.5 GiB resident).
LOW_MEMORY_BYTES = 1 << 30


@dataclass
class Check:
    name: str
    status: str
    value: str
    expected: str = ""
    hint: str = ""
    rule: str = ""  # the rule this row reports ('' for rows of an installed node only)
    verdict: Verdict | None = field(default=None, repr=False, compare=False)
    gpu: compat.GpuIdentity | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """The row as `check --json` prints it."""
        return {
            "name": self.name,
            "status": self.status,
            "value": self.value,
            "expected": self.expected,
            "hint": self.hint,
        }


@dataclass
class Options:
    profile: str | None = None  # None: the installed torch's profile, else default_profile
    profile_knob: str = "--profile"  # how an unknown profile's message names the setting
    min_free_disk_gb: float | None = None  # None: the matrix's floor (0 disables the check)
    require_gpu: bool = False  # a node without a GPU fails the GPU rows instead of skipping
    installed: bool = True  # False: a node the roles are about to install (the preflight)
    gpu_model: str = ""  # the GPU the inventory declares (a key of the matrix gpus)
    compute_capability: str = ""  # the declared capability of a GPU the matrix does not list
    gpu_stack_forced: bool = False  # driver and toolkit installed without a GPU (disk floor)
    waived: frozenset[str] = frozenset()  # rules reported as warnings (preflight_check_*)
    today: str = ""  # "YYYY-MM-DD" the support dates are judged on; empty: the node's clock


def choose_profile(facts: NodeFacts, matrix: Matrix, options: Options) -> tuple[Profile, str]:
    """(profile, why). An explicit name must exist (MatrixError names the knob); otherwise the
    profile whose torch pin the installed torch satisfies, then the one with torch's CUDA, then
    default_profile."""
    if options.profile:
        return matrix.profile(options.profile, options.profile_knob), options.profile_knob
    if facts.torch_version:
        for prof in matrix.profiles.values():
            if compat.torch_matches(facts.torch_version, prof.torch):
                return prof, f"matches torch {facts.torch_version}"
        for prof in matrix.profiles.values():
            if prof.cuda == facts.torch_cuda:
                return prof, "matches torch's CUDA {}".format(
                    facts.torch_cuda or "(none: CPU build)"
                )
    return matrix.profile(None), "matrix default_profile"


def fits(what: str, names: Sequence[str]) -> str:
    return f"use {what} {' or '.join(names)}" if names else f"no {what} of the matrix fits"


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _broken(options: Options, rule: str, status: str = FAIL) -> str:
    """A broken rule's status: a waived rule only warns."""
    return WARN if rule in options.waived else status


def _check_distro(facts: NodeFacts, matrix: Matrix, options: Options) -> Check:
    if not facts.distro and options.installed:
        return Check("distro", SKIP, "no /etc/os-release", "", rule=compat.DISTRO)
    verdict = compat.distro_verdict(matrix, facts.distro)
    expected = "a distro of the matrix"
    if verdict.ok:
        # Past its standard support a distro still installs and serves: a warning, never a
        # failure, that names where to move.
        today = options.today or datetime.date.today().isoformat()
        support = compat.support_verdict(matrix, facts.distro, today)
        if not support.ok:
            hint = f"{support.reason}: {fits('distro', support.distros)}"
            return Check("distro", WARN, facts.distro, expected, hint, compat.SUPPORT, support)
        return Check("distro", OK, facts.distro, expected, rule=compat.DISTRO, verdict=verdict)
    # installed: torch imports or not whatever the distro; the roles are what need the matrix
    status = _broken(options, compat.DISTRO, WARN if options.installed else FAIL)
    value = facts.distro or "unknown"
    return Check("distro", status, value, expected, verdict.reason, compat.DISTRO, verdict)


def _check_python(facts: NodeFacts, matrix: Matrix, prof: Profile, options: Options) -> Check:
    expected = "one of " + ", ".join(prof.pythons)
    python = facts.python_version
    verdict = compat.python_verdict(matrix, prof, python)
    if compat.below_runtime_floor(python):
        # below the runtime's own floor nothing serves: a failure, not a warning
        status = _broken(options, compat.PYTHON)
        return Check(
            "python",
            status,
            python,
            f">= {compat.MIN_PYTHON}",
            verdict.reason,
            compat.PYTHON,
            verdict,
        )
    if not verdict.ok:
        # installed: a warning, the torch that imports (checked next) is the better witness
        status = _broken(options, compat.PYTHON, WARN if options.installed else FAIL)
        hint = f"{verdict.reason}: {fits('profile', verdict.profiles)}"
        return Check("python", status, python, expected, hint, compat.PYTHON, verdict)
    return Check("python", OK, python, expected, rule=compat.PYTHON, verdict=verdict)


def _check_torch(facts: NodeFacts, prof: Profile, require_gpu: bool) -> list[Check]:
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


def _check_driver(facts: NodeFacts, prof: Profile, matrix: Matrix) -> Check:
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


def _describes_wheel(facts: NodeFacts, prof: Profile) -> bool:
    """Is the installed torch (or, without a CUDA torch, the one to be installed) the build the
    profile describes? Then the matrix's rule judges the GPU; otherwise the wheel's own arch
    list is the witness."""
    if not facts.arch_list:
        return True
    if not (prof.cuda and facts.torch_cuda):
        return False
    return compat.parse_version(prof.cuda)[:2] == compat.parse_version(facts.torch_cuda)[:2]


def _judged_gpus(facts: NodeFacts, options: Options) -> list[Gpu]:
    """The GPUs the gpu rule judges: those a driver lists, else those on the bus, else (a node
    that has a GPU nothing names, or one that only declares it) one GPU known by its
    declaration (so a refusal can be shown on any node: -e torchfleet_gpu_model=H100)."""
    if facts.gpus or facts.pci:
        return facts.gpus or facts.pci
    if facts.gpu_present or options.gpu_model or options.compute_capability:
        return [Gpu(0, "", None, via="device files")]
    return []


def _check_gpu_arch(
    facts: NodeFacts, prof: Profile, matrix: Matrix, options: Options
) -> list[Check]:
    matrix_rule = _describes_wheel(facts, prof)
    expected = f"driven by profile {prof.name}" if matrix_rule else "in torch.cuda.get_arch_list()"
    checks, seen = [], set()
    for gpu in _judged_gpus(facts, options):
        who = compat.resolve_gpu(
            matrix,
            name=gpu.name,
            reported_cc=gpu.compute_capability,
            declared_model=options.gpu_model,
            declared_cc=options.compute_capability,
        )
        cc = who.compute_capability
        if cc in seen:
            continue
        seen.add(cc)
        label = f"gpu arch ({gpu.name or who.label})"
        verdict = None
        if matrix_rule:
            verdict = compat.gpu_verdict(matrix, prof, who)
            # installed, an unknown capability only warns: torch tells at run time
            broken = WARN if options.installed and not cc else FAIL
            status = OK if verdict.ok else _broken(options, compat.GPU, broken)
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
                    else f"{verdict.reason}: {fits('profile', verdict.profiles)}"
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
            hint = "" if status == OK else fits("profile", matrix.profiles_for(cc))
        checks.append(Check(label, status, value, expected, hint, compat.GPU, verdict, who))
    return checks


def _check_gpus(facts: NodeFacts, prof: Profile, matrix: Matrix, options: Options) -> list[Check]:
    """An installed node's GPU rows: the driver, what it lists, each GPU's arch, cuDNN."""
    if not facts.gpu_present:
        status = FAIL if options.require_gpu else SKIP
        hint = "--require-gpu: no NVIDIA driver or device found" if options.require_gpu else ""
        return [
            Check(label, status, "no NVIDIA GPU", "", hint)
            for label in ("nvidia driver", "gpu", "cudnn")
        ]
    checks = [_check_driver(facts, prof, matrix)]
    if facts.gpus:
        listed = ", ".join(f"{g.index}: {g.name}" for g in facts.gpus)
        checks.append(Check("gpu", OK, listed, "a GPU"))
    elif facts.driver_version:
        value = f"driver {facts.driver_version} but no GPU listed"
        hint = "nvidia-smi lists no device: check `dmesg | grep -i nvrm`"
        checks.append(Check("gpu", FAIL, value, "a GPU", hint))
    else:
        value = "no driver lists the GPU(s) on the PCI bus"
        hint = "install the NVIDIA driver (nvidia_driver role) and reboot"
        checks.append(Check("gpu", FAIL, value, "a GPU", hint))
    if facts.gpus or facts.pci:
        checks.extend(_check_gpu_arch(facts, prof, matrix, options))
    checks.append(_check_cudnn(facts))
    return checks


def _check_cudnn(facts: NodeFacts) -> Check:
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


def _check_gpu_model(facts: NodeFacts, options: Options) -> list[Check]:
    """The GPU a node shows against the one its inventory declares."""
    first = facts.first_gpu
    if not (options.gpu_model and first and first.model):
        return []
    value = f"{first.model} ({first.via})"
    if first.model == options.gpu_model:
        return [Check("gpu model", OK, value, options.gpu_model, rule=GPU_MODEL_MATCH)]
    status = _broken(options, GPU_MODEL_MATCH)
    hint = f"the inventory declares {options.gpu_model} but this node has {value}"
    return [Check("gpu model", status, value, options.gpu_model, hint, GPU_MODEL_MATCH)]


def min_free_disk(matrix: Matrix, facts: NodeFacts, options: Options) -> float:
    """The free-disk floor this node is judged by: the driver and toolkit land where a GPU is,
    or where they are forced (an image bake)."""
    gpu_stack = facts.gpu_present or options.gpu_stack_forced
    return compat.min_free_disk(matrix, options.min_free_disk_gb, gpu_stack)


def _check_disk(facts: NodeFacts, matrix: Matrix, options: Options) -> Check:
    disk = facts.disk
    gpu_stack = facts.gpu_present or options.gpu_stack_forced
    verdict = compat.disk_verdict(
        matrix, disk.free_bytes, options.min_free_disk_gb, disk.reused_bytes, gpu_stack
    )
    value = f"{disk.free_bytes / 1e9:.1f} GB free at {disk.checked_path}"
    expected = f">= {min_free_disk(matrix, facts, options):g} GB"
    if not verdict.ok:
        hint = verdict.reason + ": grow the volume"
        return Check("disk", FAIL, value, expected, hint, compat.DISK, verdict)
    return Check("disk", OK, value, expected, rule=compat.DISK, verdict=verdict)


def _check_kernel_headers(facts: NodeFacts, options: Options) -> list[Check]:
    """DKMS builds the driver against the running kernel: its headers must be installed or
    installable (only asked on a GPU node; `headers_offered` None: apt was not asked)."""
    kernel = facts.kernel
    if kernel is None or not facts.gpu_present:
        return []
    expected = f"linux-headers-{kernel.release} installed or offered by apt"
    if kernel.headers_present or kernel.headers_offered is not False:
        value = "installed" if kernel.headers_present else "not installed"
        return [Check("kernel headers", OK, value, expected, rule=KERNEL_HEADERS)]
    reason = (
        f"no headers for the running kernel {kernel.release}: linux-headers-{kernel.release} "
        "is neither installed nor offered by apt, so DKMS cannot build the driver"
    )
    status = _broken(options, KERNEL_HEADERS)
    return [Check("kernel headers", status, "missing", expected, reason, KERNEL_HEADERS)]


def _check_memory(facts: NodeFacts) -> Check:
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


def judge(facts: NodeFacts, matrix: Matrix, options: Options) -> tuple[Profile, list[Check]]:
    """Pure: (chosen profile, checks) for these facts under this matrix."""
    prof, why = choose_profile(facts, matrix, options)
    checks = [Check("profile", OK, f"{prof.name} ({why})", "a profile of the matrix")]
    checks.append(_check_distro(facts, matrix, options))
    checks.append(_check_python(facts, matrix, prof, options))
    if options.installed:
        checks.extend(_check_torch(facts, prof, options.require_gpu))
        checks.extend(_check_gpus(facts, prof, matrix, options))
    else:
        checks.extend(_check_gpu_arch(facts, prof, matrix, options))
    checks.extend(_check_gpu_model(facts, options))
    checks.append(_check_disk(facts, matrix, options))
    if options.installed:
        checks.append(_check_memory(facts))
    else:
        checks.extend(_check_kernel_headers(facts, options))
    return prof, checks


def summarize(checks: Sequence[Check]) -> dict[str, int]:
    return {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
