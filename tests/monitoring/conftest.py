"""Fixtures of the monitoring tests; shared helpers live in monitoring_support.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parents[1]):  # monitoring_support; roles.monitoring.generator and infra
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from monitoring_support import load_filters  # noqa: E402


@pytest.fixture(scope="session")
def filters() -> ModuleType:
    return load_filters()
