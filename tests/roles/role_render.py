"""Run a role's own variables through Ansible without a host: a one-play playbook on localhost
with the role's defaults (and vars) as vars files, `play_vars` beside them and `extra` as extra
vars (above them, as inventory values and preflight's facts are above a role's defaults).
`run_play` runs any tasks there; `render` copies each `outputs` value (a Jinja expression: a
template lookup, a variable) to a file and returns the texts. tests/roles/conftest.py's
fixtures and the tests of other folders (tests/monitoring) use these."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def run_play(
    tmp_path: Path,
    vars_files: list[Path],
    tasks: list[dict],
    extra: dict[str, Any],
    env: dict[str, str],
    play_vars: dict[str, Any] | None = None,
) -> None:
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [str(f) for f in vars_files],
            "vars": {
                "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                **(play_vars or {}),
            },
            "tasks": tasks,
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    done = subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "@extra.json", "play.yml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def render(
    tmp_path: Path,
    vars_files: list[Path],
    outputs: dict[str, str],
    extra: dict[str, Any],
    env: dict[str, str],
) -> dict[str, str]:
    tasks = [
        {"ansible.builtin.copy": {"content": content, "dest": str(tmp_path / name), "mode": "0644"}}
        for name, content in outputs.items()
    ]
    run_play(tmp_path, vars_files, tasks, extra, env)
    return {name: (tmp_path / name).read_text() for name in outputs}


def template(path: Path) -> str:
    """The Jinja expression that renders the template at `path`."""
    return "{{ lookup('ansible.builtin.template', '" + str(path) + "') }}"
