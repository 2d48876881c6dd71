"""torchfleet-compat reaches every place it runs: the node bundle carries the package (the
preflight module's module_utils) and its wheel (the runtime depends on it), and the runtime's
distribution declares the dependency."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from infra import bundle

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "compat/src/torchfleet_compat"


def test_the_bundle_carries_the_package_and_both_wheels(tmp_path):
    wheels = []
    for name in ("torchfleet_compat", "torchfleet_runtime"):
        wheel = tmp_path / f"{name}-0.1.0-py3-none-any.whl"
        wheel.write_bytes(name.encode())
        wheels.append(wheel)
    group_vars = ROOT / "inventories/aws-dev/group_vars"
    members = bundle._members("aws-dev", group_vars, {}, (wheels[0], wheels[1]))
    shipped = {n for n in members if n.startswith("compat/src/")}
    # every module of the package, byte for byte, and nothing else (no build metadata)
    assert shipped == {f"compat/src/torchfleet_compat/{p.name}" for p in PACKAGE.glob("*.py")}, (
        shipped
    )
    for name in shipped:
        assert members[name] == (ROOT / name).read_bytes()
    manifest = json.loads(members["manifest.json"])
    assert manifest["compat_wheel"] == "wheels/torchfleet_compat-0.1.0-py3-none-any.whl"
    assert manifest["runtime_wheel"] == "wheels/torchfleet_runtime-0.1.0-py3-none-any.whl"
    assert members[manifest["compat_wheel"]] == b"torchfleet_compat"
    # the library module that imports it is there too, and no module_utils of the role's own
    assert "roles/preflight/library/torchfleet_probe.py" in members
    assert not [n for n in members if "/module_utils/" in n]


def test_the_runtime_depends_on_compat_and_compat_on_nothing():
    runtime = tomllib.loads((ROOT / "runtime/pyproject.toml").read_text())["project"]
    compat = tomllib.loads((ROOT / "compat/pyproject.toml").read_text())["project"]
    assert any(d.startswith("torchfleet-compat") for d in runtime["dependencies"])
    assert compat["name"] == "torchfleet-compat" and compat["dependencies"] == []
    assert compat["requires-python"] == ">=3.8"
