"""The version matrix (compat/matrix.yml): its schema and every compatibility rule, once.

Contract. Standard library only, Python 3.8+, used unchanged by every layer that judges a node:
- infra on the controller (`infra/matrix.py` locates the file; `infra/config/` validates a
  stack with the rules below before any resource exists);
- the preflight role's module on the node, before anything is installed, and
  `torchfleet-runtime check` on a converged node or in the runtime image: both through judge.py
  (Ansible ships this package with the module as module_utils).

What it holds:
- `parse(data, source)` -> `Matrix`: the schema, validated in one pass; `MatrixError` lists
  every problem as "<file>: <key> = <value> is invalid; allowed: <what>". `read(path)` loads
  the file (YAML through PyYAML where importable, else JSON) and parses it.
- version helpers (`parse_version`, `version_at_least`, `torch_matches`, `python_in`);
- GPU identification: `match_gpu(name, models)` (token match, longest key wins) and
  `resolve_gpu(...)` (which model and compute capability a node has, from what was probed and
  what the inventory declares);
- the rules, each returning a `Verdict` (rule, ok, reason and the profiles/distros that would
  fit): `distro_verdict`, `support_verdict` (past the distro's end of standard support: a
  warning everywhere), `python_verdict`, `gpu_verdict`, `driver_verdict`, `disk_verdict`
  (with `tree_bytes`: what an earlier install occupies counts as room). judge.py applies them
  to a node; infra applies `python_verdict` and `gpu_verdict` to a stack.
  The Python rule includes the runtime's own floor, MIN_PYTHON (its requires-python).
  A verdict's `reason` is the same sentence everywhere; each entry point adds the fix in its
  own words (a stack key, a role variable, a CLI flag) from `profiles` / `distros`.
- `arch_coverage(capability, arch_list)`: does an installed wheel's arch list run on a GPU
  (for builds the matrix does not describe).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from .problems import MISSING, InvalidInput, Problems, sentence

OK, WARN, FAIL = "ok", "warn", "fail"

# torchfleet-runtime's own floor (runtime/pyproject.toml requires-python): a Python a profile's
# torch supports but the runtime does not (cu116 lists 3.7) cannot serve either.
MIN_PYTHON = "3.8"

# Rule names, as entry points report them.
DISTRO, PYTHON, GPU, DRIVER, DISK = "distro", "python", "gpu", "driver", "disk"
SUPPORT = "support"


class MatrixError(InvalidInput):
    """A matrix that does not follow the schema, or a name it does not know: every problem, one
    line each, naming the file, the key, the value and what is allowed."""


# --------------------------------------------------------------------------- versions


def parse_version(text: str) -> tuple[int, ...]:
    """'535.104.05' -> (535, 104, 5); '1.12.1+cu116' -> (1, 12, 1); '2.1.0a0' -> (2, 1, 0).

    Only the leading dotted numbers count: local tags (+cu116) and pre-release suffixes are
    compared separately where they matter.
    """
    base = str(text).strip().split("+", 1)[0]
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


def minor(version: str) -> str:
    """'3.11.7' -> '3.11'."""
    parts = parse_version(version) + (0,)
    return f"{parts[0]}.{parts[1]}"


def python_in(version: str, allowed: Iterable[str]) -> bool:
    """'3.11.7' is in ['3.10', '3.11']: compare major.minor only ('3.1' is not '3.10')."""
    return parse_version(version)[:2] in {parse_version(v)[:2] for v in allowed}


def cc_tuple(capability: str) -> tuple[int, int]:
    """'8.6' -> (8, 6)."""
    major, _, minor_ = str(capability).partition(".")
    return int(major), int(minor_ or 0)


# --------------------------------------------------------------------------- schema

_CC_RE = re.compile(r"^[0-9]+\.[0-9]$")
_PY_RE = re.compile(r"^3\.[0-9]+$")
_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*([+.][0-9A-Za-z.]+)?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DATE_RE = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$")
DRIVER_SOURCES = ("distro", "cuda_repo")
GPU_ARCHES = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")


@dataclass(frozen=True)
class Profile:
    """A CUDA profile: what a node runs. `compute_capabilities` is the wheel's arch list;
    a GPU outside [min of it, max_compute_capability] cannot be driven. `cuda` None: CPU only."""

    name: str
    cuda: str | None
    toolkit_version: str | None
    min_driver: str | None
    torch: str
    torchvision: str | None
    wheel_index: str | None
    pythons: tuple[str, ...]
    compute_capabilities: tuple[str, ...]
    max_compute_capability: str | None
    runfile: str | None
    toolkit_repos: tuple[str, ...]
    toolkit_package: str | None

    def as_dict(self) -> dict[str, Any]:
        """The profile as the matrix file writes it (the `torchfleet_profile` fact)."""
        out = {k: getattr(self, k) for k in PROFILE_FIELDS}
        for k in ("pythons", "compute_capabilities", "toolkit_repos"):
            out[k] = list(out[k])
        return out

    @property
    def capability_range(self) -> tuple[str, str] | None:
        """(lowest, highest) compute capability the profile drives; None for a CPU profile."""
        if self.cuda is None or not self.compute_capabilities or not self.max_compute_capability:
            return None
        return min(self.compute_capabilities, key=cc_tuple), self.max_compute_capability


@dataclass(frozen=True)
class GpuModel:
    name: str
    compute_capability: str
    arch: str
    memory_gib: int


@dataclass(frozen=True)
class Distro:
    name: str
    python: str
    cuda_repo: str
    driver_source: str
    # The end of the distro's free security support, "YYYY-MM-DD" (see compat/matrix.yml).
    standard_support_until: str


@dataclass(frozen=True)
class Matrix:
    source: str
    default_profile: str
    profiles: dict[str, Profile]
    gpus: dict[str, GpuModel]
    distros: dict[str, Distro]
    min_free_disk_gb: float
    min_free_disk_gb_without_gpu: float
    data: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    def profile(self, name: str | None, knob: str = "profile") -> Profile:
        """The named profile (the default one for an empty name), or MatrixError naming `knob`
        (the entry point's own name for the setting) and the allowed values."""
        name = name or self.default_profile
        if name not in self.profiles:
            allowed = "a profile of {}: {}".format(self.source, ", ".join(self.profiles))
            raise MatrixError(sentence(knob, name, allowed))
        return self.profiles[name]

    def gpu(self, model: str) -> GpuModel:
        return self.gpus[model]

    def profiles_for(self, capability: str) -> list[str]:
        """Every profile that drives a GPU of this compute capability, in matrix order."""
        return [p.name for p in self.profiles.values() if _drives(p, capability)]

    def profiles_for_python(self, python: str) -> list[str]:
        return [p.name for p in self.profiles.values() if python_in(python, p.pythons)]

    def toolkit_from_repo(self, profile: Profile, distro: str) -> bool:
        """NVIDIA published this profile's toolkit as packages for the distro's repository
        (else the cuda role installs the runfile)."""
        return distro in self.distros and self.distros[distro].cuda_repo in profile.toolkit_repos

    def distros_for(self, profile: Profile) -> list[str]:
        """Distros whose system Python the profile's torch supports."""
        return [d.name for d in self.distros.values() if python_in(d.python, profile.pythons)]


PROFILE_FIELDS = (
    "cuda",
    "toolkit_version",
    "min_driver",
    "torch",
    "torchvision",
    "wheel_index",
    "pythons",
    "compute_capabilities",
    "max_compute_capability",
    "runfile",
    "toolkit_repos",
    "toolkit_package",
)
GPU_FIELDS = ("compute_capability", "arch", "memory_gib")
DISTRO_FIELDS = ("python", "cuda_repo", "driver_source", "standard_support_until")
TOP_FIELDS = (
    "default_profile",
    "profiles",
    "gpus",
    "distros",
    "min_free_disk_gb",
    "min_free_disk_gb_without_gpu",
)


class _Schema(Problems):
    """Collects every problem of one matrix (named by its file) instead of stopping at the first,
    with readers for the schema's shapes."""

    def mapping(self, key: str, value: Any, fields: Sequence[str]) -> Mapping[str, Any] | None:
        """`value` when it is a mapping with exactly `fields` (else None, problems recorded)."""
        where = key + "." if key else ""
        if not isinstance(value, dict):
            self.add(key or "(the file)", value, "a mapping with the keys " + ", ".join(fields))
            return None
        complete = True
        for k in value:
            if k not in fields:
                self.add(where + str(k), value[k], "the keys " + ", ".join(fields))
        for k in fields:
            if k not in value:
                self.add(
                    where + k, MISSING, "a value: each entry has the keys " + ", ".join(fields)
                )
                complete = False
        return value if complete else None

    def text(
        self, key: str, value: Any, pattern: re.Pattern[str], allowed: str, optional: bool = False
    ) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not pattern.match(value):
            quote = (
                " in quotes (YAML reads 3.10 as the number 3.1)"
                if isinstance(value, (int, float)) and not isinstance(value, bool)
                else ""
            )
            self.add(key, value, allowed + quote + (", or null" if optional else ""))
            return None
        return value

    def texts(
        self, key: str, value: Any, pattern: re.Pattern[str], allowed: str, non_empty: bool = False
    ) -> tuple[str, ...]:
        if not isinstance(value, list) or (non_empty and not value):
            self.add(
                key, value, "a {}list of {}".format("non-empty " if non_empty else "", allowed)
            )
            return ()
        out = []
        for i, item in enumerate(value):
            got = self.text(f"{key}[{i}]", item, pattern, allowed)
            if got is not None:
                out.append(got)
        return tuple(out)


_CC_ALLOWED = 'a compute capability MAJOR.MINOR such as "8.6"'

# Each entry builder gets a mapping that has exactly its section's fields; `parse` keeps the
# entry only when building it recorded no problem.


def _profile(s: _Schema, name: str, key: str, raw: Mapping[str, Any]) -> Profile | None:
    before = len(s.problems)  # the cross-field checks below need sound fields
    cc = _CC_ALLOWED
    ver = 'a version such as "11.6" or "510.47.03"'
    cuda = s.text(
        key + ".cuda",
        raw.get("cuda"),
        re.compile(r"^[0-9]+\.[0-9]+$"),
        'a CUDA version MAJOR.MINOR such as "11.6"',
        optional=True,
    )
    prof = Profile(
        name=name,
        cuda=cuda,
        toolkit_version=s.text(
            key + ".toolkit_version", raw.get("toolkit_version"), _VERSION_RE, ver, optional=True
        ),
        min_driver=s.text(
            key + ".min_driver", raw.get("min_driver"), _VERSION_RE, ver, optional=True
        ),
        torch=s.text(
            key + ".torch", raw.get("torch"), _VERSION_RE, 'a torch version such as "1.12.1+cu116"'
        )
        or "",
        torchvision=s.text(
            key + ".torchvision",
            raw.get("torchvision"),
            _VERSION_RE,
            "a torchvision version",
            optional=True,
        ),
        wheel_index=s.text(
            key + ".wheel_index",
            raw.get("wheel_index"),
            re.compile(r"^(https?|file)://\S+$"),
            "an http(s):// or file:// URL",
            optional=True,
        ),
        pythons=s.texts(
            key + ".pythons",
            raw.get("pythons"),
            _PY_RE,
            'Python versions such as "3.10"',
            non_empty=True,
        ),
        compute_capabilities=s.texts(
            key + ".compute_capabilities", raw.get("compute_capabilities"), _CC_RE, cc
        ),
        max_compute_capability=s.text(
            key + ".max_compute_capability",
            raw.get("max_compute_capability"),
            _CC_RE,
            cc,
            optional=True,
        ),
        runfile=s.text(
            key + ".runfile", raw.get("runfile"), _NAME_RE, "a runfile name", optional=True
        ),
        toolkit_repos=s.texts(
            key + ".toolkit_repos",
            raw.get("toolkit_repos"),
            _NAME_RE,
            "NVIDIA repository directories such as ubuntu2204",
        ),
        toolkit_package=s.text(
            key + ".toolkit_package",
            raw.get("toolkit_package"),
            _NAME_RE,
            "a package name such as cuda-toolkit-11-6",
            optional=True,
        ),
    )
    if len(s.problems) > before:
        return None
    # The CUDA fields come together: a profile either drives GPUs (all set) or none (all null).
    gpu_fields = {
        "min_driver": prof.min_driver,
        "max_compute_capability": prof.max_compute_capability,
        "compute_capabilities": prof.compute_capabilities,
    }
    for k, v in gpu_fields.items():
        if bool(v) != bool(prof.cuda):
            s.add(
                f"{key}.{k}",
                raw.get(k),
                f"set when cuda is set, empty/null when it is not (cuda = {prof.cuda!r})",
            )
    if prof.toolkit_version and not (prof.runfile and prof.toolkit_package):
        s.add(
            key + ".toolkit_version",
            prof.toolkit_version,
            "null, or set together with runfile and toolkit_package",
        )
    if prof.capability_range and cc_tuple(max(prof.compute_capabilities, key=cc_tuple)) > cc_tuple(
        prof.max_compute_capability or "0.0"
    ):
        s.add(
            key + ".max_compute_capability",
            prof.max_compute_capability,
            f"at least the highest of compute_capabilities ({max(prof.compute_capabilities, key=cc_tuple)})",
        )
    return prof


def _gpu(s: _Schema, name: str, key: str, raw: Mapping[str, Any]) -> GpuModel | None:
    cc = s.text(key + ".compute_capability", raw.get("compute_capability"), _CC_RE, _CC_ALLOWED)
    arch = raw.get("arch")
    if arch not in GPU_ARCHES:
        s.add(key + ".arch", arch, " | ".join(GPU_ARCHES))
    memory = raw.get("memory_gib")
    if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
        s.add(key + ".memory_gib", memory, "a whole number of GiB > 0")
        return None  # reported; nothing to build
    if cc is None:
        return None
    return GpuModel(name=name, compute_capability=cc, arch=str(arch), memory_gib=memory)


def _distro(s: _Schema, name: str, key: str, raw: Mapping[str, Any]) -> Distro | None:
    if not re.match(r"^(debian-[0-9]+|ubuntu-[0-9]{2}\.[0-9]{2})$", name):
        s.add("distros", name, "names such as debian-12 or ubuntu-22.04 (see distro_name)")
    python = s.text(key + ".python", raw.get("python"), _PY_RE, 'a Python version such as "3.10"')
    repo = s.text(
        key + ".cuda_repo",
        raw.get("cuda_repo"),
        _NAME_RE,
        "an NVIDIA repository directory such as ubuntu2204",
    )
    source = raw.get("driver_source")
    if source not in DRIVER_SOURCES:
        s.add(key + ".driver_source", source, " | ".join(DRIVER_SOURCES))
    until = s.text(
        key + ".standard_support_until",
        raw.get("standard_support_until"),
        _DATE_RE,
        'a date "YYYY-MM-DD" in quotes (YAML reads an unquoted date as a date)',
    )
    if python is None or repo is None or until is None:
        return None
    return Distro(
        name=name,
        python=python,
        cuda_repo=repo,
        driver_source=str(source),
        standard_support_until=until,
    )


def parse(data: Any, source: str = "compat/matrix.yml") -> Matrix:
    """Validate a parsed matrix in one pass; MatrixError lists every problem."""
    s = _Schema(source)
    top = s.mapping("", data, TOP_FIELDS)
    if top is None:  # mapping() said why
        raise MatrixError(s.problems)
    sections: dict[str, dict[str, Any]] = {}
    builders = (
        ("profiles", _profile, PROFILE_FIELDS),
        ("gpus", _gpu, GPU_FIELDS),
        ("distros", _distro, DISTRO_FIELDS),
    )
    for section, build, fields in builders:
        raw = top.get(section)
        sections[section] = {}
        if not isinstance(raw, dict) or not raw:
            s.add(section, raw, "a non-empty mapping of names to entries")
            continue
        for name, value in raw.items():
            key = f"{section}.{name}"
            entry = s.mapping(key, value, fields)
            if entry is None:
                continue
            before = len(s.problems)
            built = build(s, str(name), key, entry)
            if built is not None and len(s.problems) == before:
                sections[section][str(name)] = built
    default = top.get("default_profile")
    if isinstance(top.get("profiles"), dict) and default not in top["profiles"]:
        s.add("default_profile", default, "a key of profiles: " + ", ".join(top["profiles"]))
    disk = top.get("min_free_disk_gb")
    if isinstance(disk, bool) or not isinstance(disk, (int, float)) or disk < 0:
        s.add("min_free_disk_gb", disk, "a number of GB >= 0")
        disk = None
    bare = top.get("min_free_disk_gb_without_gpu")
    if (
        isinstance(bare, bool)
        or not isinstance(bare, (int, float))
        or bare < 0
        or (disk is not None and bare > disk)
    ):
        s.add(
            "min_free_disk_gb_without_gpu",
            bare,
            "a number of GB >= 0 and <= min_free_disk_gb ({})".format(
                "?" if disk is None else f"{disk:g}"
            ),
        )
    s.raise_if_any(MatrixError)
    assert isinstance(disk, (int, float)) and isinstance(bare, (int, float))  # checked above
    return Matrix(
        source=source,
        default_profile=str(default),
        profiles=sections["profiles"],
        gpus=sections["gpus"],
        distros=sections["distros"],
        min_free_disk_gb=float(disk),
        min_free_disk_gb_without_gpu=float(bare),
        data=data,
    )


def read(path: str) -> Matrix:
    """Read and validate a matrix file: YAML (needs PyYAML, which the controller and the runtime
    have) or JSON (standard library only)."""
    try:
        with open(str(path), encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise MatrixError([f"{path}: cannot read the version matrix: {exc}"]) from exc
    if str(path).endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise MatrixError([f"{path}: not JSON: {exc}"]) from exc
    else:
        import yaml  # not on a bare node: there the probe is handed the parsed matrix instead

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise MatrixError([f"{path}: not YAML: {exc}"]) from exc
    return parse(data, str(path))


# --------------------------------------------------------------------------- GPUs and distros


def match_gpu(name: str | None, models: Iterable[str]) -> str | None:
    """The matrix key naming this GPU ('NVIDIA A100-SXM4-80GB' -> 'A100-80G'), or None.

    A key matches when each of its dash-separated tokens appears in the name as a token of its
    own: not glued to a letter or digit before it, and not followed by a digit (so "A10" does
    not match "A100" and "L4" does not match "L40S", while "80G" matches "80GB"). The longest
    matching key wins: "A100-80G" over "A100", "A10G" over "A10".
    """
    if not name:
        return None
    best = None
    for key in models:
        tokens = [t for t in str(key).split("-") if t]
        matches = bool(tokens) and all(
            re.search(r"(?<![A-Za-z0-9])" + re.escape(t) + r"(?![0-9])", name) for t in tokens
        )
        if matches and (best is None or len(key) > len(best)):
            best = key
    return best


@dataclass(frozen=True)
class GpuIdentity:
    model: str  # a key of the matrix gpus, or ''
    compute_capability: str  # "8.6", or '' when nothing tells
    label: str  # how messages name the GPU


def resolve_gpu(
    matrix: Matrix,
    name: str | None = None,
    reported_cc: str | None = None,
    declared_model: str | None = None,
    declared_cc: str | None = None,
) -> GpuIdentity:
    """Which GPU this is. The capability a driver reports wins; then the matrix entry of the
    model the name matches, then of the model the inventory declares; then a declared
    capability (a GPU the matrix does not list)."""
    detected = match_gpu(name, matrix.gpus) or ""
    model = detected or (declared_model or "")
    if reported_cc and _CC_RE.match(str(reported_cc)):
        cc = str(reported_cc)
    elif model in matrix.gpus:
        cc = matrix.gpus[model].compute_capability
    else:
        cc = str(declared_cc or "")
    return GpuIdentity(model=model, compute_capability=cc, label=model or name or "this GPU")


def distro_name(os_id: str, version_id: str) -> str:
    """The matrix's name for a distribution: Debian by major version ('debian-12'), Ubuntu by
    release ('ubuntu-22.04'), from /etc/os-release's ID and VERSION_ID."""
    os_id = (os_id or "unknown").strip().lower()
    version = (version_id or "").strip()
    if os_id == "debian":
        version = version.split(".", 1)[0]
    return f"{os_id}-{version}" if version else os_id


def read_os_release(path: str = "/etc/os-release") -> str:
    """distro_name() of this machine ('' when /etc/os-release is missing)."""
    values = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                key, sep, value = line.strip().partition("=")
                if sep:
                    values[key] = value.strip().strip("\"'")
    except OSError:
        return ""
    return distro_name(values.get("ID", ""), values.get("VERSION_ID", ""))


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Verdict:
    """One rule's answer. `reason` says what holds or what is wrong, in words every entry point
    prints verbatim; `profiles` / `distros` are the choices that would satisfy the rule (the
    entry point names its own setting in front of them)."""

    rule: str
    ok: bool
    reason: str
    profiles: tuple[str, ...] = ()
    distros: tuple[str, ...] = ()


def _drives(profile: Profile, capability: str) -> bool:
    rng = profile.capability_range
    return rng is not None and cc_tuple(rng[0]) <= cc_tuple(capability) <= cc_tuple(rng[1])


def distro_verdict(matrix: Matrix, distro: str) -> Verdict:
    if distro in matrix.distros:
        return Verdict(DISTRO, True, f"{distro} is a distro of the matrix")
    return Verdict(
        DISTRO,
        False,
        "{} is not a distro of {} (supported: {})".format(
            distro or "an unknown distro", matrix.source, ", ".join(matrix.distros)
        ),
        distros=tuple(matrix.distros),
    )


def support_verdict(matrix: Matrix, distro: str, today: str) -> Verdict:
    """Is the distro still inside its standard support on `today` ("YYYY-MM-DD")? A distro past
    it still installs and runs: entry points warn, never fail, and name the supported distros."""
    known = matrix.distros.get(distro)
    if known is None:
        return distro_verdict(matrix, distro)
    until = known.standard_support_until
    supported = tuple(d.name for d in matrix.distros.values() if d.standard_support_until >= today)
    if today > until:
        return Verdict(
            SUPPORT,
            False,
            f"{distro}'s standard support ended on {until} (no free security updates since)",
            distros=supported,
        )
    return Verdict(SUPPORT, True, f"{distro} has standard support until {until}")


def below_runtime_floor(python: str) -> bool:
    """Is this Python older than torchfleet-runtime itself supports (MIN_PYTHON)?"""
    return parse_version(python)[:2] < parse_version(MIN_PYTHON)[:2]


def python_verdict(matrix: Matrix, profile: Profile, python: str) -> Verdict:
    """Does the profile's torch support this Python, and does the runtime (MIN_PYTHON)?"""
    if python_in(python, profile.pythons) and not below_runtime_floor(python):
        return Verdict(PYTHON, True, f"torch {profile.torch} supports Python {minor(python)}")
    distros = tuple(
        d for d in matrix.distros_for(profile) if not below_runtime_floor(matrix.distros[d].python)
    )
    if below_runtime_floor(python):
        reason = f"torchfleet-runtime needs Python {MIN_PYTHON} or newer, not {minor(python)}"
        return Verdict(PYTHON, False, reason, distros=distros)
    return Verdict(
        PYTHON,
        False,
        f"torch {profile.torch} ({profile.name}) supports Python "
        f"{profile.pythons[0]}-{profile.pythons[-1]}, not {minor(python)}",
        profiles=tuple(matrix.profiles_for_python(python)),
        distros=distros,
    )


def gpu_verdict(matrix: Matrix, profile: Profile, gpu: GpuIdentity) -> Verdict:
    """Can the profile's CUDA drive this GPU: its compute capability lies between the lowest
    arch the wheel is built for and the highest the profile's CUDA reaches (both bounds)."""
    cc = gpu.compute_capability
    if not cc:
        return Verdict(
            GPU,
            False,
            f"the NVIDIA GPU ({gpu.label}) is not in the matrix gpus and its compute capability is "
            "unknown",
        )
    fits = tuple(matrix.profiles_for(cc))
    rng = profile.capability_range
    if rng is None:
        return Verdict(
            GPU,
            False,
            f"{profile.name} has no CUDA and cannot drive {gpu.label} (compute {cc})",
            profiles=fits,
        )
    lo, hi = rng
    if cc_tuple(cc) > cc_tuple(hi):
        why = "> " + hi
    elif cc_tuple(cc) < cc_tuple(lo):
        why = "< " + lo
    else:
        return Verdict(GPU, True, f"{profile.name} drives {gpu.label} (compute {cc})")
    return Verdict(
        GPU,
        False,
        f"{profile.name} cannot drive {gpu.label} (compute {cc} {why})",
        profiles=fits,
    )


def min_driver_for(matrix: Matrix, cuda: str) -> tuple[str | None, bool]:
    """(minimum driver, exact) for a CUDA version, from the matrix's profiles only.

    exact: a profile has this CUDA major.minor, so its min_driver is the documented minimum.
    Otherwise the highest min_driver among profiles of an older CUDA is a lower bound (a
    driver below it is certainly too old) but not a sufficient one.
    """
    want = parse_version(cuda)[:2]
    bound: str | None = None
    for prof in matrix.profiles.values():
        if not prof.cuda or not prof.min_driver:
            continue
        have = parse_version(prof.cuda)[:2]
        if have == want:
            return prof.min_driver, True
        if have < want and (bound is None or version_at_least(prof.min_driver, bound)):
            bound = prof.min_driver
    return bound, False


def driver_verdict(matrix: Matrix, cuda: str, driver: str) -> tuple[str, str, str | None]:
    """(status, reason, minimum) of an NVIDIA driver for torch's CUDA: FAIL below the minimum,
    WARN when the matrix has no profile for that CUDA (its minimum is then only a lower bound)."""
    minimum, exact = min_driver_for(matrix, cuda)
    if minimum and not version_at_least(driver, minimum):
        return FAIL, f"CUDA {cuda} needs driver >= {minimum} (min_driver in the matrix)", minimum
    if not exact:
        return (
            WARN,
            f"{matrix.source} has no profile for CUDA {cuda}, so its minimum driver is not verified",
            minimum,
        )
    return OK, f"driver {driver} >= {minimum} (CUDA {cuda})", minimum


def min_free_disk(matrix: Matrix, override: float | None, gpu_stack: bool = True) -> float:
    """The free-disk floor in GB: an explicit override (0 disables), else the matrix's for a node
    that gets the driver and toolkit (`gpu_stack`) or for one that gets only wheels and model."""
    if override is not None:
        return float(override)
    return matrix.min_free_disk_gb if gpu_stack else matrix.min_free_disk_gb_without_gpu


def disk_verdict(
    matrix: Matrix,
    free_bytes: int,
    override: float | None = None,
    reused_bytes: int = 0,
    gpu_stack: bool = True,
) -> Verdict:
    """Is there room to install? `gpu_stack`: the node gets the NVIDIA driver and toolkit (a
    GPU node, or one where they are forced). `reused_bytes` is what an earlier install already
    occupies where a re-run writes (the node's torchfleet tree): a converged node is judged by
    free + reused, so re-running the playbook never fails for the room its own install takes
    (a 30 GB volume with 12 GB installed has 18 GB free and still fits)."""
    minimum = min_free_disk(matrix, override, gpu_stack)
    free_gb = free_bytes / 1e9
    reused_gb = reused_bytes / 1e9
    have = f"{free_gb:.1f} GB free" + (
        f" + {reused_gb:.1f} GB torchfleet already occupies" if reused_bytes > 0 else ""
    )
    needs = "driver, toolkit, wheels and model" if gpu_stack else "wheels and model (no GPU stack)"
    if minimum > 0 and free_gb + reused_gb < minimum:
        return Verdict(DISK, False, f"only {have} but a node needs {minimum:g} GB for {needs}")
    return Verdict(DISK, True, f"{have} (>= {minimum:g} GB)")


def tree_bytes(root: str, device: int | None = None) -> int:
    """Bytes allocated to the files under `root` on filesystem `device` (default: root's own),
    0 when it is absent or elsewhere; symbolic links and other filesystems are not followed. A
    node's torchfleet tree (a venv with torch, the wheelhouse, the model) is some 10-30 thousand
    files: about 0.1 s."""
    try:
        top = os.lstat(root)
    except OSError:
        return 0
    if device is not None and top.st_dev != device:
        return 0
    device, total, dirs = top.st_dev, 0, [root]
    while dirs:
        try:
            entries = os.scandir(dirs.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_dev != device:
                    continue  # a mount point inside the tree
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    total += st.st_blocks * 512
    return total


_ARCH_RE = re.compile(r"^(sm|compute)_(\d+)(\d)([a-z]?)$")


def arch_coverage(capability: str, arch_list: Sequence[str]) -> tuple[str, str]:
    """Does a wheel built for `arch_list` (torch.cuda.get_arch_list()) run on a GPU of
    compute capability `capability` ('8.6')? Returns (status, reason).

    ok:   an exact cubin (sm_86 / sm_86a), or PTX (compute_XY) of the same major at or below
          the GPU's minor, which the driver JIT-compiles on first use;
    warn: only a lower same-major cubin (sm_80 on an 8.6 GPU): NVIDIA's binary compatibility
          runs it, but kernels are not built for this GPU;
    fail: nothing of the GPU's major at or below its minor (e.g. only sm_86 for a 9.0 GPU).
    Arch-specific cubins (sm_90a) run on exactly that capability and never forward.
    """
    major, minor_ = cc_tuple(capability)
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
        if e_major != major or e_minor > minor_:
            continue
        if e_minor == minor_ and kind == "sm":
            exact.append(entry)
        elif kind == "compute" and not suffix:
            ptx.append(entry)
        elif kind == "sm" and not suffix:
            lower_cubin.append(entry)
    if exact:
        return OK, f"{exact[0]} in the wheel's arch list"
    if ptx:
        return OK, f"PTX {max(ptx)} is JIT-compiled for sm_{major}{minor_} on first use"
    if lower_cubin:
        return (
            WARN,
            f"only {max(lower_cubin)} (runs by binary compatibility, not built for sm_{major}{minor_})",
        )
    return FAIL, f"no sm_{major}x or compute_{major}x entry at or below sm_{major}{minor_}"
