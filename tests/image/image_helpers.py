"""Plain helpers for the image tests (fixtures live in conftest.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The role tests' podman settings: runc (crun fails on this host's hybrid cgroups) and the
# ulimits runc must be allowed to set.
CONTAINERS_CONF = REPO / "tests" / "roles" / "containers.conf"
FIGURES = REPO / ".cache" / "image-test" / "figures.json"


def load_build_script() -> ModuleType:
    """scripts/build_runtime_image.py as a module (scripts/ is not a package)."""
    path = REPO / "scripts" / "build_runtime_image.py"
    spec = importlib.util.spec_from_file_location("build_runtime_image", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unique_name(kind: str) -> str:
    return f"torchfleet-image-test-{kind}-{uuid.uuid4().hex[:8]}"


def record(section: str, values: dict[str, Any]) -> None:
    """Keep measured figures in .cache/image-test/figures.json (and print them: pytest -s)."""
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    data[section] = dict(
        values, load_average=os.getloadavg()[0], at=time.strftime("%Y-%m-%dT%H:%M:%S")
    )
    FIGURES.write_text(json.dumps(data, indent=2) + "\n")
    print(f"[image-test] {section}: {json.dumps(values)}")
