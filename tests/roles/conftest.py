"""Shared paths and helpers for the role tests (lint, syntax, Molecule)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# this folder's helpers (role_render), importable by name under --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tool_env() -> dict[str, str]:
    """Environment for ansible-* and molecule: the venv's bin first on PATH (molecule calls
    ansible-playbook by name), the repo's podman settings, no host ansible.cfg surprises."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["CONTAINERS_CONF"] = str(REPO / "tests" / "roles" / "containers.conf")
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    env.setdefault("ANSIBLE_FORCE_COLOR", "0")
    env.setdefault("NO_COLOR", "1")
    return env
