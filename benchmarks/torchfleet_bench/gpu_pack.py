"""`torchfleet-bench gpu-pack`: everything a bare GPU machine lacks for the GPU side by side
(`torchfleet-bench gpu-peers`) and `scripts/gpu_check.sh`, in one folder to carry there.

The GPU machine has a Python with a CUDA build of torch and a few common packages
(`GPU_MACHINE_HAS`), no package index and no `wrk`. The pack, built on a machine with an index:
- `wheels/`: the runtime's and Mosec's dependencies that machine lacks, for its Python and
  platform (`pip download --no-deps --only-binary=:all: --python-version V --implementation cp
  --platform manylinux...`), at the repository's pins (`requirements/`, Mosec's lock
  `benchmarks/peers/requirements/mosec.txt`), and torchfleet-compat and torchfleet-runtime built
  from this tree (`pip wheel --no-deps`). Torch and its own dependencies are never packed.
- `bin/wrk` and `lib/libluajit-5.1.so.2` from Debian (`apt-get download`, `dpkg -x`; the library
  a real copy, as the device tool does not carry symbolic links).
- `run.sh`: installs the wheels with `pip install --no-index --no-deps --target SITE`, puts SITE,
  the tree (the benchmark tool and infra's client run from it, beside the peers' apps and wrk
  script) and the pack's `bin`/`lib` on the paths, and runs `torchfleet-bench gpu-peers`
  (`run.sh check` runs `scripts/gpu_check.sh` instead).
- `manifest.json`: what was packed (each wheel's sha256), for which Python, and a hash of the
  sources the runtime wheels were built from: `run.sh` warns when the carried tree differs.

Usage: torchfleet-bench gpu-pack [--out .cache/gpu-pack] [--python-version 3.12]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from torchfleet_compat.problems import sentence

from torchfleet_bench import BenchError

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / ".cache" / "gpu-pack"
# What the GPU machine's python3 already has (import name does not matter: distribution names).
GPU_MACHINE_HAS = (
    "torch",
    "numpy",
    "pytest",
    "prometheus-client",
    "PyYAML",
    "nvidia-ml-py",
    "uvloop",
)
# Built from this tree: the runtime and the settings contract it imports.
TREE_PACKAGES = ("compat", "runtime")
# scripts/gpu_check.sh's extra test plugin (pytest's `timeout` option in pyproject.toml).
CHECK_EXTRAS = ("pytest-timeout",)
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64")
DEBIAN_PACKAGES = ("wrk", "libluajit-5.1-2")
LUAJIT = "libluajit-5.1.so.2"
CARRY_LIMIT_MB = 64  # the device tool carries at most this much of git-ignored paths
SOURCE_DIRS = ("compat/src", "runtime/src")


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name_of(requirement: str) -> str:
    return canonical(re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0])


def read_pins(lines: Iterable[str]) -> dict[str, str]:
    """{canonical name: version} of `name==version` lines (comments, markers, local tags like
    `+cpu` dropped)."""
    pins: dict[str, str] = {}
    for line in lines:
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s+]+)(?:\+\S+)?", line)
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def manifest(
    runtime_deps: Iterable[str],
    mosec_lock: dict[str, str],
    pins: dict[str, str],
    machine_has: Iterable[str] = GPU_MACHINE_HAS,
    torch_deps: Iterable[str] = (),
    extras: Iterable[str] = CHECK_EXTRAS,
) -> list[str]:
    """The `name==version` specs to download: the runtime's dependencies, Mosec's lock and the
    check's extras, less what the machine has, torch's own dependencies and this tree's packages;
    pinned from `pins` (the repository's lock), else from Mosec's lock. Sorted, no duplicates.
    A dependency with no pin anywhere is an error (a pack must be reproducible)."""
    skip = {canonical(n) for n in (*machine_has, *torch_deps)}
    skip |= {canonical(f"torchfleet-{p}") for p in TREE_PACKAGES}
    wanted = {_name_of(r) for r in runtime_deps} | set(mosec_lock) | {_name_of(e) for e in extras}
    specs, unpinned = [], []
    for name in sorted(wanted - skip):
        version = pins.get(name) or mosec_lock.get(name)
        if version is None:
            unpinned.append(name)
        else:
            specs.append(f"{name}=={version}")
    if unpinned:
        raise BenchError(
            sentence(
                "unpinned pack dependency",
                ", ".join(unpinned),
                "a name pinned in requirements/constraints.txt or the Mosec lock",
            )
        )
    return specs


def tree_hash(root: Path, dirs: Iterable[str] = SOURCE_DIRS) -> str:
    """sha256 over the relative paths and bytes of the .py files under `dirs` (what the runtime
    wheels are built from), independent of timestamps and of the folder's location."""
    h = hashlib.sha256()
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            h.update(str(path.relative_to(root)).encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def device_call(pack: Path, root: Path = ROOT, timeout_s: int = 420) -> dict[str, Any]:
    """The device tool's call that runs the pack there (its command runs in the tree's root)."""
    rel = os.path.relpath(pack, root)
    return {
        "command": f"bash {rel}/run.sh",
        "carry": [rel],
        "timeout_s": timeout_s,
    }


# --------------------------------------------------------------------------- building


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise BenchError(
            f"{' '.join(cmd)} failed ({p.returncode}): {(p.stderr or p.stdout)[-1500:]}"
        )
    return p.stdout


def _torch_deps() -> list[str]:
    """torch's own dependencies and theirs (they come with torch on the GPU machine), from this
    interpreter's installed torch: without it they would be packed for nothing."""
    from importlib.metadata import PackageNotFoundError, requires

    def direct(name: str) -> list[str]:
        try:
            return [_name_of(r) for r in requires(name) or [] if "extra ==" not in r]
        except PackageNotFoundError:
            if name == "torch":
                raise BenchError(
                    "torch is not installed here: run gpu-pack from the project's .venv (make setup)"
                ) from None
            return []

    seen: set[str] = set()
    todo = ["torch"]
    while todo:
        for dep in direct(todo.pop()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return sorted(seen)


def _runtime_deps() -> list[str]:
    data = tomllib.loads((ROOT / "runtime" / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def specs_for_tree() -> list[str]:
    pins = read_pins((ROOT / "requirements" / "constraints.txt").read_text().splitlines())
    mosec = read_pins(
        (ROOT / "benchmarks" / "peers" / "requirements" / "mosec.txt").read_text().splitlines()
    )
    return manifest(_runtime_deps(), mosec, pins, torch_deps=_torch_deps())


def download_wheels(specs: list[str], dest: Path, python_version: str) -> None:
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            *plat,
            "-d",
            str(dest),
            *specs,
        ]
    )


def build_tree_wheels(dest: Path) -> None:
    for pkg in TREE_PACKAGES:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(dest),
                str(ROOT / pkg),
            ]
        )
    # a build leaves build/ and *.egg-info in the source folders: not ours to keep
    for pkg in TREE_PACKAGES:
        shutil.rmtree(ROOT / pkg / "build", ignore_errors=True)


def fetch_wrk(pack: Path) -> dict[str, str]:
    """wrk and a real copy of libluajit from Debian's packages (no root needed)."""
    if not shutil.which("apt-get") or not shutil.which("dpkg"):
        raise BenchError("apt-get and dpkg are needed to take wrk from Debian's packages")
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        _run(["apt-get", "download", *DEBIAN_PACKAGES], cwd=t)
        debs = sorted(t.glob("*.deb"))
        for deb in debs:
            _run(["dpkg", "-x", str(deb), str(t / "root")])
        wrk = t / "root" / "usr" / "bin" / "wrk"
        libs = sorted((t / "root").rglob(LUAJIT))
        if not wrk.exists() or not libs:
            raise BenchError(f"wrk or {LUAJIT} missing from {[d.name for d in debs]}")
        (pack / "bin").mkdir(parents=True, exist_ok=True)
        (pack / "lib").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wrk, pack / "bin" / "wrk")
        (pack / "bin" / "wrk").chmod(0o755)
        shutil.copyfile(libs[0].resolve(), pack / "lib" / LUAJIT)  # the file, not the link
        return {d.name.split("_")[0]: d.name for d in debs}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def size_mb(folder: Path) -> float:
    return round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20, 2)


def build(out: Path, python_version: str) -> dict[str, Any]:
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    specs = specs_for_tree()
    print(f"downloading {len(specs)} wheels for CPython {python_version}: {' '.join(specs)}")
    download_wheels(specs, wheels, python_version)
    print("building torchfleet-compat and torchfleet-runtime from the tree")
    build_tree_wheels(wheels)
    print("taking wrk and libluajit from Debian's packages")
    debs = fetch_wrk(out)
    shutil.copyfile(Path(__file__).with_name("gpu_pack_run.sh"), out / "run.sh")
    (out / "run.sh").chmod(0o755)
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    info: dict[str, Any] = {
        "python_version": python_version,
        "platforms": list(PLATFORMS),
        "specs": specs,
        "wheels": {p.name: sha256(p) for p in sorted(wheels.glob("*.whl"))},
        "debian": debs,
        "source_commit": commit,
        "source_hash": tree_hash(ROOT),
        "machine_has": list(GPU_MACHINE_HAS),
    }
    (out / "manifest.json").write_text(json.dumps(info, indent=1) + "\n")
    info["size_mb"] = size_mb(out)
    return info


def verify(manifest_path: Path, root: Path = ROOT) -> list[str]:
    """Warnings about a pack that does not fit this tree and interpreter (run.sh prints them)."""
    info = json.loads(manifest_path.read_text())
    warnings = []
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if info["python_version"] != here:
        warnings.append(
            f"the pack holds wheels for Python {info['python_version']}, this is {here}: "
            f"rebuild it with --python-version {here}"
        )
    if info["source_hash"] != tree_hash(root):
        warnings.append(
            "the runtime's sources differ from those the pack's wheels were built from "
            f"(commit {info['source_commit'][:12]}): rebuild the pack to measure this tree"
        )
    return warnings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="torchfleet-bench gpu-pack", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the pack's folder (git-ignored)")
    ap.add_argument(
        "--python-version",
        default="3.12",
        help="the GPU machine's Python, MAJOR.MINOR (default 3.12; 3.11 for a dry run here)",
    )
    ap.add_argument("--verify", type=Path, metavar="MANIFEST", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.verify:
        for w in verify(args.verify):
            print(f"gpu-pack: WARNING: {w}", file=sys.stderr)
        return 0
    if not re.fullmatch(r"3\.\d+", args.python_version):
        ap.error(sentence("--python-version", args.python_version, "MAJOR.MINOR, e.g. 3.12"))
    out = args.out.resolve()
    try:
        info = build(out, args.python_version)
    except BenchError as exc:
        print(f"torchfleet-bench gpu-pack: {exc}", file=sys.stderr)
        return 2
    call = device_call(out)
    print(
        f"\nwrote {out}: {len(info['wheels'])} wheels, wrk, {LUAJIT}, run.sh; {info['size_mb']} MiB"
    )
    if info["size_mb"] > CARRY_LIMIT_MB:
        print(f"WARNING: over the device tool's {CARRY_LIMIT_MB} MiB carry limit", file=sys.stderr)
        return 1
    print(
        "\nOn the GPU machine, through the device tool (it copies the working tree; the pack is\n"
        f"git-ignored, so name it in carry):\n  {json.dumps(call)}\n"
        f"`bash {call['carry'][0]}/run.sh --help` lists the benchmark's options (defaults: both\n"
        "models, --device cuda, results under $OUT/gpu-peers);\n"
        f"`bash {call['carry'][0]}/run.sh check` runs scripts/gpu_check.sh from the same pack."
    )
    return 0
