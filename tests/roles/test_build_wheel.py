"""The inference_runtime role's controller-side wheel builder: one build per source content."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "roles/inference_runtime/files/build_wheel.py"


def make_project(root: Path) -> Path:
    pkg = root / "src" / "tinypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tinypkg"\nversion = "0.1.0"\n'
        '[tool.setuptools.packages.find]\nwhere = ["src"]\n'
    )
    return root


def build(source: Path, cache: Path) -> dict:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(source), str(cache)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_builds_once_per_source_content(tmp_path: Path) -> None:
    source = make_project(tmp_path / "proj")
    cache = tmp_path / "cache"
    first = build(source, cache)
    assert first["built"] is True
    assert Path(first["wheel"]).name == "tinypkg-0.1.0-py3-none-any.whl"

    again = build(source, cache)
    assert again == {**first, "built": False}

    (source / "src" / "tinypkg" / "__init__.py").write_text("VALUE = 2\n")
    changed = build(source, cache)
    assert changed["built"] is True
    assert changed["wheel"] != first["wheel"]
    assert changed["sha256"] != first["sha256"]
    with zipfile.ZipFile(changed["wheel"]) as whl:
        assert whl.read("tinypkg/__init__.py") == b"VALUE = 2\n"


def test_leaves_the_checkout_clean(tmp_path: Path) -> None:
    source = make_project(tmp_path / "proj")
    before = sorted(p.relative_to(source) for p in source.rglob("*"))
    build(source, tmp_path / "cache")
    assert sorted(p.relative_to(source) for p in source.rglob("*")) == before


def test_rejects_a_directory_without_pyproject(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "pyproject.toml" in result.stderr and "inference_runtime_source_dir" in result.stderr


def test_describe_names_a_prebuilt_wheel_and_its_sha256(tmp_path: Path) -> None:
    """inference_runtime_wheel set: the same JSON line, so the role compares the same checksum
    with the node's marker either way; a path that is not a wheel is refused by name."""
    built = build(make_project(tmp_path / "proj"), tmp_path / "cache")
    described = subprocess.run(
        [sys.executable, str(SCRIPT), "--describe", built["wheel"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(described.stdout) == {**built, "built": False}
    missing = subprocess.run(
        [sys.executable, str(SCRIPT), "--describe", str(tmp_path / "nope.whl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0
    assert "nope.whl: not a wheel file (inference_runtime_wheel)" in missing.stderr
