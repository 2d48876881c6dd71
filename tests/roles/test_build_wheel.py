"""The inference_runtime role's controller-side wheel builder: one build per source content,
several wheels (torchfleet-compat, the runtime) in one call, one marker for the node."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "roles/inference_runtime/files/build_wheel.py"


def make_project(root: Path, name: str = "tinypkg") -> Path:
    pkg = root / "src" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "0.1.0"\n'
        '[tool.setuptools.packages.find]\nwhere = ["src"]\n'
    )
    return root


def run(cache: Path, *items: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(cache), *map(str, items)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def build(source: Path, cache: Path) -> dict:
    """The one wheel of a one-item call."""
    result = run(cache, source)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    (wheel,) = out["wheels"]
    assert out["built"] == wheel["built"] and out["marker"] == wheel["sha256"]
    assert out["names"] == Path(wheel["wheel"]).name
    return wheel


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


def test_files_beside_the_sources_do_not_rebuild(tmp_path: Path) -> None:
    """compat/ keeps matrix.yml and catalog.yml beside its package: editing them must not make a
    new wheel (a node would reinstall it and restart the runtime for a price change)."""
    source = make_project(tmp_path / "proj")
    (source / "catalog.yml").write_text("a: 1\n")
    first = build(source, tmp_path / "cache")
    (source / "catalog.yml").write_text("a: 2\n")
    (source / "Containerfile").write_text("FROM x\n")
    assert build(source, tmp_path / "cache") == {**first, "built": False}
    (source / "README.md").write_text("# tinypkg\n")  # part of the wheel's metadata: rebuilds
    assert build(source, tmp_path / "cache")["built"] is True


def test_leaves_the_checkout_clean(tmp_path: Path) -> None:
    source = make_project(tmp_path / "proj")
    before = sorted(p.relative_to(source) for p in source.rglob("*"))
    build(source, tmp_path / "cache")
    assert sorted(p.relative_to(source) for p in source.rglob("*")) == before


def test_rejects_a_directory_without_pyproject(tmp_path: Path) -> None:
    result = run(tmp_path / "cache", tmp_path)
    assert result.returncode != 0
    assert "pyproject.toml" in result.stderr and "inference_runtime_source_dir" in result.stderr


def test_describe_names_a_prebuilt_wheel_and_its_sha256(tmp_path: Path) -> None:
    """inference_runtime_wheel set: the same JSON, so the role compares the same checksum with
    the node's marker either way; a path that is not a wheel is refused by name."""
    built = build(make_project(tmp_path / "proj"), tmp_path / "cache")
    described = run(tmp_path / "other-cache", Path(built["wheel"]))
    assert json.loads(described.stdout)["wheels"] == [{**built, "built": False}]
    assert not (tmp_path / "other-cache").exists()  # describing builds nothing
    missing = run(tmp_path / "cache", tmp_path / "nope.whl")
    assert missing.returncode != 0
    assert "nope.whl: not a wheel file (inference_runtime_wheel" in missing.stderr


def test_several_items_give_the_wheels_in_order_and_one_marker(tmp_path: Path) -> None:
    """The role's call: compat's sources and a prebuilt runtime wheel, say; a change to one
    rebuilds that one only, and the marker (what the node holds once installed) changes."""
    first = make_project(tmp_path / "first", "firstpkg")
    prebuilt = Path(build(make_project(tmp_path / "second", "secondpkg"), tmp_path / "c2")["wheel"])
    cache = tmp_path / "cache"
    out = json.loads(run(cache, first, prebuilt).stdout)
    names = [Path(w["wheel"]).name for w in out["wheels"]]
    assert names == ["firstpkg-0.1.0-py3-none-any.whl", "secondpkg-0.1.0-py3-none-any.whl"]
    assert out["names"] == " ".join(names) and out["built"] is True
    assert out["marker"] == " ".join(w["sha256"] for w in out["wheels"])
    again = json.loads(run(cache, first, prebuilt).stdout)
    assert again == {
        **out,
        "built": False,
        "wheels": [{**w, "built": False} for w in out["wheels"]],
    }
    (first / "src" / "firstpkg" / "__init__.py").write_text("VALUE = 2\n")
    changed = json.loads(run(cache, first, prebuilt).stdout)
    assert changed["built"] is True and changed["marker"] != out["marker"]
    assert changed["wheels"][1] == again["wheels"][1]
