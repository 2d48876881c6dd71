"""Render what a role would write, without a host: a one-play playbook on localhost whose tasks
copy each `outputs` value (a Jinja expression: a template lookup, a variable) to a file, with
the role's defaults (and vars) as vars files and `extra` as extra vars (above them, as inventory
values are above defaults). Returns each output's text."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def render(
    tmp_path: Path,
    vars_files: list[Path],
    outputs: dict[str, str],
    extra: dict[str, Any],
    env: dict[str, str],
) -> dict[str, str]:
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [str(f) for f in vars_files],
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
            "tasks": [
                {
                    "ansible.builtin.copy": {
                        "content": content,
                        "dest": str(tmp_path / name),
                        "mode": "0644",
                    }
                }
                for name, content in outputs.items()
            ],
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
    assert done.returncode == 0, done.stdout + done.stderr
    return {name: (tmp_path / name).read_text() for name in outputs}


def template(path: Path) -> str:
    """The Jinja expression that renders the template at `path`."""
    return "{{ lookup('ansible.builtin.template', '" + str(path) + "') }}"
