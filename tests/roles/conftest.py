"""Shared paths and helpers for the role tests (lint, syntax, Molecule)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


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
    with Ansible's output unless the play succeeds."""

    def play(role: str, tasks: list[dict], extra: dict, play_vars: dict | None = None) -> None:
        folder = REPO / "roles" / role
        doc = [
            {
                "hosts": "localhost",
                "gather_facts": False,
                "vars_files": [
                    str(folder / "defaults" / "main.yml"),
                    str(folder / "vars" / "main.yml"),
                ],
                "vars": {
                    "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                    **(play_vars or {}),
                },
                "tasks": tasks,
            }
        ]
        (tmp_path / "play.yml").write_text(json.dumps(doc))
        (tmp_path / "extra.json").write_text(json.dumps(extra))
        done = subprocess.run(
            [
                "ansible-playbook",
                "-i",
                "localhost,",
                "-c",
                "local",
                "-e",
                "@extra.json",
                "play.yml",
            ],
            cwd=tmp_path,
            env=tool_env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

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
                    "content": "{{ lookup('ansible.builtin.template', '%s') }}"
                    % (folder / template),
                    "dest": str(tmp_path / kind),
                    "mode": "0644",
                }
            }
            for kind, template in templates.items()
        ]
        role_play(role, tasks, extra)
        return {kind: (tmp_path / kind).read_text() for kind in templates}

    return render
