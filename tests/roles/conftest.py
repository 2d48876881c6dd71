"""Shared paths and helpers for the role tests (lint, syntax, Molecule)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# this folder's helpers (role_render), importable by name under --import-mode=importlib
sys.path.insert(0, str(Path(__file__).resolve().parent))
import role_render  # noqa: E402


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


@pytest.fixture
def role_play(tmp_path: Path, tool_env: dict[str, str]) -> Callable[..., None]:
    """role_play(role, tasks, extra_vars, play_vars=None): `tasks` on localhost in a play that
    loads the role's own defaults and vars, `play_vars` beside them and `extra_vars` above them
    (as preflight's facts and inventory values are above a role's defaults); fails the test
    with Ansible's output unless the play succeeds (role_render.run_play)."""

    def play(role: str, tasks: list[dict], extra: dict, play_vars: dict | None = None) -> None:
        folder = REPO / "roles" / role
        role_render.run_play(
            tmp_path,
            [folder / "defaults" / "main.yml", folder / "vars" / "main.yml"],
            tasks,
            extra,
            tool_env,
            play_vars,
        )

    return play


@pytest.fixture
def render_templates(
    tmp_path: Path, role_play: Callable[..., None]
) -> Callable[[str, dict[str, str], dict], dict[str, str]]:
    """render_templates(role, {kind: template}, extra_vars): each of the role's templates as
    Ansible renders it from the role's own defaults and vars, `extra_vars` above them; the
    rendered text by kind."""

    def render(role: str, templates: dict[str, str], extra: dict) -> dict[str, str]:
        folder = REPO / "roles" / role / "templates"
        tasks = [
            {
                "ansible.builtin.copy": {
                    "content": role_render.template(folder / template),
                    "dest": str(tmp_path / kind),
                    "mode": "0644",
                }
            }
            for kind, template in templates.items()
        ]
        role_play(role, tasks, extra)
        return {kind: (tmp_path / kind).read_text() for kind in templates}

    return render
