"""Shared paths and helpers for the monitoring tests: the role's rule files, its filter plugin
(the Python that decides the Prometheus and Alertmanager configuration), the generated
dashboard, and the Debian binaries the tests run."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "monitoring"
RULES_DIR = ROLE / "files" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.rules.yml"))
DASHBOARD_JSON = ROLE / "files" / "dashboards" / "torchfleet.json"


def load_filters() -> ModuleType:
    """The role's filter plugin as Ansible loads it: a file, not a package."""
    path = ROLE / "filter_plugins" / "torchfleet_monitoring.py"
    spec = importlib.util.spec_from_file_location("torchfleet_monitoring", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def need(binary: str) -> str:
    """The path of a Debian binary the test needs; a clear failure when it is missing."""
    found = shutil.which(binary) or (
        f"/usr/bin/{binary}" if Path(f"/usr/bin/{binary}").exists() else None
    )
    if not found:
        pytest.fail(
            f"{binary} is not installed: run `make setup` (it installs prometheus, "
            "prometheus-alertmanager and prometheus-node-exporter from Debian)"
        )
    return found


def promtool_test(path: Path) -> None:
    """`promtool test rules` on one unit test file (run in its folder: its rule_files are
    relative to it); fails with promtool's own output."""
    done = subprocess.run(
        [need("promtool"), "test", "rules", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
