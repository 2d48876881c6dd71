"""The preflight role's decisions: its settings in, everything its tasks act on out.

Contract. The role's module (roles/preflight/library/torchfleet_probe.py) is a thin Ansible
wrapper around `run(params)`: it validates the role's inputs against the matrix, probes the node
(probe.py, before install) and judges it with the judge `torchfleet-runtime check` uses
(judge.py, `installed=False`), then returns what the tasks need, ready-made:
  ansible_facts  the torchfleet_* facts later roles read (the role's README lists them)
  problems       one sentence per refused check, naming the role variable that fixes it
  refused        whether there is any
  refusal        the problems as one numbered sentence for the fail task ('' when none)
  summary        one line describing the node
  packages       what the role installs or refreshes before probing again (pciutils to name the
                 GPU, fresh package lists to look for kernel headers): `needed`, and how
  rules          each matrix rule's verdict (distro, python, gpu), for tests and -v output
  probe          the facts as probed, for -v output
The tasks only act on these and report; no decision is left to their Jinja.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any, Mapping

from . import matrix as compat
from .judge import FAIL, GPU_MODEL_MATCH, KERNEL_HEADERS, WARN, Check, Options, judge, min_free_disk
from .matrix import Matrix, Profile
from .probe import ROOTS, NodeFacts, probe
from .problems import Problems

# The module's options (the role passes its variables through; defaults are the role's).
ARGUMENTS: dict[str, dict[str, Any]] = {
    "matrix": {"type": "dict", "required": True},
    "matrix_file": {"type": "str", "default": "compat/matrix.yml"},
    "profile": {"type": "raw", "default": ""},
    "gpu_model": {"type": "raw", "default": ""},
    "compute_capability": {"type": "raw", "default": ""},
    "install_root": {"type": "str", "default": "/opt"},
    "min_free_disk_gb": {"type": "float"},
    "reused_paths": {"type": "list", "elements": "str", "default": []},
    "nvidia_driver_force": {"type": "bool", "default": False},
    "cuda_force": {"type": "bool", "default": False},
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
WAIVABLE = (
    compat.PYTHON,
    compat.GPU,
    compat.DISTRO,
    KERNEL_HEADERS,
    GPU_MODEL_MATCH,
)


class PreflightError(ValueError):
    """The role's inputs or its matrix are wrong: the module fails with this message."""


def _text(value: Any) -> str:
    """A role variable that may be unset (None), a number (YAML's 8.6) or a string."""
    return "" if value is None else str(value)


def check_inputs(matrix: Matrix, params: Mapping[str, Any]) -> list[str]:
    """The role's inputs, each named with what is allowed (all problems at once)."""
    found = Problems()
    profile = _text(params["profile"])
    if profile and profile not in matrix.profiles:
        allowed = "a profile of {}: {}".format(matrix.source, ", ".join(matrix.profiles))
        found.add("torchfleet_cuda_profile", profile, allowed)
    gpu_model = _text(params["gpu_model"])
    if gpu_model and gpu_model not in matrix.gpus:
        found.add(
            "torchfleet_gpu_model",
            gpu_model,
            "a GPU of the matrix gpus: {} (or leave it unset and set "
            "torchfleet_compute_capability for another GPU)".format(", ".join(matrix.gpus)),
        )
    capability = _text(params["compute_capability"])
    if capability and not re.match(r"^[0-9]+\.[0-9]+$", capability):
        found.add("torchfleet_compute_capability", capability, 'MAJOR.MINOR in quotes, e.g. "8.6"')
    floor = params["min_free_disk_gb"]
    if floor is not None and floor < 0:
        found.add(
            "preflight_min_free_disk_gb",
            floor,
            f"a number of GB >= 0 (0 disables the check), or null for the matrix's {matrix.min_free_disk_gb:g}",
        )
    if not params["install_root"].startswith("/"):
        found.add("preflight_install_root", params["install_root"], "an absolute path")
    for key in sorted(set(params["roots"]) - set(ROOTS)):
        found.add("roots." + key, params["roots"][key], "the keys " + ", ".join(ROOTS))
    return found.problems


def options(params: Mapping[str, Any]) -> Options:
    """The judge's options for the role's settings."""
    return Options(
        profile=_text(params["profile"]) or None,
        profile_knob="torchfleet_cuda_profile",
        min_free_disk_gb=params["min_free_disk_gb"],
        installed=False,
        gpu_model=_text(params["gpu_model"]),
        compute_capability=_text(params["compute_capability"]),
        # the disk floor: a node without a GPU gets the driver and toolkit only when forced
        gpu_stack_forced=bool(params["nvidia_driver_force"] or params["cuda_force"]),
        waived=frozenset(rule for rule in WAIVABLE if not params["check_" + rule]),
    )


def _either(choices: Any, fallback: str) -> str:
    return " or ".join(choices) if choices else fallback


def problem(check: Check, facts: NodeFacts, profile: Profile, params: Mapping[str, Any]) -> str:
    """A refused check as the role says it: the rule's reason, then which variable to change."""
    verdict = check.verdict
    if check.rule == compat.DISTRO and verdict:
        return (
            verdict.reason + ": use one of those images, or set preflight_check_distro=false "
            "to try anyway"
        )
    if check.rule == compat.PYTHON and verdict:
        return (
            "{} on this node ({}): set torchfleet_cuda_profile to {}, or run a distro whose "
            "Python {} supports ({})".format(
                verdict.reason,
                params["python_interpreter"] or facts.python_executable,
                _either(verdict.profiles, "a profile that supports it"),
                profile.name,
                ", ".join(verdict.distros) or "none listed",
            )
        )
    if check.rule == compat.GPU and verdict and check.gpu and check.gpu.compute_capability:
        return "{}: set torchfleet_cuda_profile to {}".format(
            verdict.reason, _either(verdict.profiles, "a newer profile (none in the matrix fits)")
        )
    if check.rule == compat.GPU and verdict:
        return (
            '{} (PCI {}): set torchfleet_compute_capability (e.g. "8.6") or add the model to '
            "compat/matrix.yml `gpus`".format(
                verdict.reason, facts.pci[0].device_id if facts.pci else "?"
            )
        )
    if check.rule == GPU_MODEL_MATCH:
        return (
            f"the inventory declares torchfleet_gpu_model={check.expected} but this node has "
            f"{check.value}: fix the inventory (or infra's instance type), or set "
            "preflight_check_gpu_model_match=false"
        )
    if check.rule == compat.DISK and verdict:
        return (
            "{} at {} (filesystem of {}): grow the disk, or lower preflight_min_free_disk_gb (0 "
            "disables the check)".format(
                verdict.reason, params["install_root"], facts.disk.checked_path
            )
        )
    if check.rule == KERNEL_HEADERS:
        return (
            "{}: {}, then rerun; or set preflight_check_kernel_headers=false if the driver comes "
            "prebuilt".format(
                check.hint,
                params["kernel_upgrade_hint"] or "install the current kernel and its headers",
            )
        )
    return f"{check.name}: {check.value} ({check.hint})"


def result(matrix: Matrix, facts: NodeFacts, params: Mapping[str, Any]) -> dict[str, Any]:
    """facts + the role's settings -> the module's result (see the module docstring)."""
    opts = options(params)
    profile, checks = judge(facts, matrix, opts)
    problems = [problem(c, facts, profile, params) for c in checks if c.status == FAIL]
    gpu_rows = [c for c in checks if c.rule == compat.GPU]
    first = facts.first_gpu
    identity = compat.resolve_gpu(
        matrix,
        name=first.name if first else None,
        reported_cc=first.compute_capability if first else None,
        declared_model=opts.gpu_model,
        declared_cc=opts.compute_capability,
    )
    count = max(len(facts.gpus), len(facts.pci), len(facts.device_files))
    distro_entry = matrix.distros.get(facts.distro)
    published = {
        "torchfleet_cuda_profile": profile.name,
        "torchfleet_profile": profile.as_dict(),
        "torchfleet_distro": facts.distro,
        "torchfleet_python_version": compat.minor(facts.python_version),
        "torchfleet_gpu_present": facts.gpu_present,
        "torchfleet_gpu_count": count,
        "torchfleet_gpu_model": identity.model,
        "torchfleet_compute_capability": identity.compute_capability,
        "torchfleet_nvidia_driver_loaded": facts.driver_version or "",
        "torchfleet_apt_mirror": facts.apt_mirror or "",
        # where the NVIDIA packages come from on this distro (the driver and cuda roles' input)
        "torchfleet_cuda_repo": distro_entry.cuda_repo if distro_entry else "",
        "torchfleet_driver_source": distro_entry.driver_source if distro_entry else "distro",
        "torchfleet_toolkit_from_repo": matrix.toolkit_from_repo(profile, facts.distro),
    }
    if facts.gpu_present:
        gpu_text = "{} x {} (compute {}, via {}, {})".format(
            count,
            identity.model or (first.name if first else "") or "unknown",
            identity.compute_capability or "?",
            first.via if first else "device files",
            "driver " + facts.driver_version if facts.driver_version else "no driver loaded",
        )
    else:
        gpu_text = "none detected{}: driver and toolkit steps will be skipped unless forced".format(
            f" (declared {identity.model})" if identity.model else ""
        )
    floor = min_free_disk(matrix, facts, opts)
    disk = facts.disk
    summary = (
        "{}, Python {}, profile {} (torch {}), GPU: {}, {} GB free{} at {}, {} problem(s)".format(
            facts.distro,
            published["torchfleet_python_version"],
            profile.name,
            profile.torch,
            gpu_text,
            round(disk.free_bytes / 1e9, 1),
            f" (+{round(disk.reused_bytes / 1e9, 1)} GB installed)" if disk.reused_bytes else "",
            params["install_root"],
            len(problems),
        )
    )
    kernel = facts.kernel
    headers_missing = bool(
        "kernel_headers" not in opts.waived
        and facts.gpu_present
        and kernel
        and not kernel.headers_present
        and not kernel.headers_offered
    )
    pciutils = bool(params["install_pciutils"] and facts.pci and not facts.lspci_available)
    return {
        "ansible_facts": published,
        "problems": problems,
        # Ansible shows a module's `warnings`: a distro past its standard support, a waived rule
        "warnings": [f"{c.name} {c.value}: {c.hint}" for c in checks if c.status == WARN],
        "refused": bool(problems),
        "refusal": " ".join(f"({i}) {p}." for i, p in enumerate(problems, 1)),
        "summary": summary,
        "packages": {
            "needed": pciutils or headers_missing,
            "pciutils": pciutils,
            "refresh_lists": headers_missing,
            "cache_valid_time": 3600 if facts.apt_lists_present else 0,
        },
        "min_free_disk_gb": floor,
        "rules": {
            compat.DISTRO: all(
                c.verdict.ok for c in checks if c.rule == compat.DISTRO and c.verdict
            ),
            compat.PYTHON: all(
                c.verdict.ok for c in checks if c.rule == compat.PYTHON and c.verdict
            ),
            **({compat.GPU: all(c.verdict.ok for c in gpu_rows if c.verdict)} if gpu_rows else {}),
        },
        "probe": asdict(facts),
    }


def run(params: Mapping[str, Any]) -> dict[str, Any]:
    """The module's whole job; PreflightError when the matrix or the role's inputs are wrong."""
    try:
        matrix = compat.parse(params["matrix"], params["matrix_file"])
    except compat.MatrixError as exc:
        raise PreflightError(
            "{} is not a torchfleet version matrix:\n{}".format(params["matrix_file"], exc)
        ) from exc
    problems = check_inputs(matrix, params)
    if problems:
        raise PreflightError(
            "preflight: " + " ".join(f"({i}) {p}." for i, p in enumerate(problems, 1))
        )
    facts = probe(
        params["install_root"],
        matrix.gpus,
        roots=params["roots"],
        installed=False,
        reused_paths=params["reused_paths"],
    )
    return result(matrix, facts, params)
