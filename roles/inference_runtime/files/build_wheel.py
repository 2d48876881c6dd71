#!/usr/bin/env python3
"""Build the node's wheels (torchfleet-compat, torchfleet-runtime) on the controller, once per
source content.

usage: build_wheel.py CACHE_DIR ITEM [ITEM ...]

Each ITEM is a project directory (built into CACHE_DIR/<hash of its sources>/, so an unchanged
checkout reuses the previous build and any edit produces a new wheel) or a prebuilt .whl
(described only: its path and sha256). A project's sources are what its wheel is made of
(WHEEL_SOURCES and src/), so files that live beside them (compat/'s
matrix.yml and catalog.yml, runtime/'s Containerfile) neither rebuild nor reinstall it. They are
copied to a temporary directory first, so building leaves no build/ or *.egg-info in the
checkout; SOURCE_DATE_EPOCH fixes the archive's timestamps. Prints one JSON line, the wheels in ITEM order:
{"wheels": [{"wheel": path, "sha256": hex, "built": bool}, ...], "built": bool,
 "names": "<file name> ...", "marker": "<sha256> ..."}; `marker` is what the role writes on the
node once these wheels are installed, so a re-run compares one string.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SKIP_DIRS = {"__pycache__", "build", "dist", ".ruff_cache", ".pytest_cache"}
# What a project's wheel is made of: these files at its root and the package tree under src/.
WHEEL_SOURCES = ("pyproject.toml", "README.md")


def source_files(root: Path):
    for name in WHEEL_SOURCES:
        if (root / name).is_file():
            yield root / name
    for dirpath, dirnames, filenames in os.walk(root / "src"):
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")
        )
        for name in sorted(filenames):
            if not name.endswith((".pyc", ".pyo")):
                yield Path(dirpath, name)


def source_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build(source: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="torchfleet-wheel-") as tmp:
        copy = Path(tmp, "project")
        for path in source_files(source):
            target = copy / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out)]
        try:  # the controller's setuptools avoids fetching one into an isolated build env
            import setuptools  # noqa: F401

            cmd.append("--no-build-isolation")
        except ImportError:
            pass
        env = dict(os.environ, SOURCE_DATE_EPOCH="315532800", PIP_DISABLE_PIP_VERSION_CHECK="1")
        result = subprocess.run(cmd + [str(copy)], capture_output=True, text=True, env=env)
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
            raise SystemExit(f"building a wheel from {source} failed")


def describe(wheel: Path) -> dict:
    if not wheel.is_file() or wheel.suffix != ".whl":
        raise SystemExit(
            f"{wheel}: not a wheel file (inference_runtime_wheel, inference_runtime_compat_wheel)"
        )
    return {"wheel": str(wheel), "sha256": file_sha256(wheel), "built": False}


def build_cached(source: Path, cache: Path) -> dict:
    if not (source / "pyproject.toml").is_file():
        raise SystemExit(
            f"{source}: no pyproject.toml "
            "(inference_runtime_source_dir, inference_runtime_compat_source_dir)"
        )
    out = cache / source_hash(source)[:16]
    built = False
    if not list(out.glob("*.whl")):
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
        try:
            build(source, staging)
            shutil.rmtree(out, ignore_errors=True)
            staging.rename(out)  # the whole directory at once: never a half-built cache entry
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        built = True
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"{out}: expected exactly one wheel, found {len(wheels)}")
    return {"wheel": str(wheels[0]), "sha256": file_sha256(wheels[0]), "built": built}


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    cache = Path(sys.argv[1]).resolve()
    wheels = []
    for item in map(Path, sys.argv[2:]):
        item = item.resolve()
        wheels.append(describe(item) if item.suffix == ".whl" else build_cached(item, cache))
    print(
        json.dumps(
            {
                "wheels": wheels,
                "built": any(w["built"] for w in wheels),
                "names": " ".join(Path(w["wheel"]).name for w in wheels),
                "marker": " ".join(w["sha256"] for w in wheels),
            }
        )
    )


if __name__ == "__main__":
    main()
