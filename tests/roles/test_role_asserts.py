"""Bad input fails early with a message naming the variable, the value and what is allowed.

Runs each role's tasks/assert.yml on localhost (no container needed) through ansible-playbook."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROFILE = {"torch": "2.13.0", "torchvision": None, "cuda": None, "wheel_index": None}


def run_assert(tmp_path: Path, env: dict[str, str], role: str, extra: dict) -> subprocess.CompletedProcess[str]:
    play = [{
        "name": "assert",
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {"torchfleet_profile": PROFILE, "torchfleet_python_version": "3.11", **extra},
        "tasks": [{"ansible.builtin.include_role": {"name": role, "tasks_from": "assert.yml"}}],
    }]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    env = dict(env, ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    return subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )


CASES = [
    ("pytorch", {}, None),
    ("pytorch", {"pytorch_wheelhouse": "relative/dir"}, "pytorch_wheelhouse=relative/dir"),
    ("pytorch", {"pytorch_index_url": "mirror.example"}, "pytorch_index_url=mirror.example"),
    ("pytorch", {"pytorch_torch_version": "latest"}, "pytorch_torch_version=latest"),
    ("inference_runtime", {}, None),
    ("inference_runtime", {"inference_runtime_config": {"max_batch": 8}}, "max_batch"),
    ("inference_runtime", {"inference_runtime_model_source": "https://example.invalid/m.pt"},
     "inference_runtime_model_source=https://example.invalid/m.pt"),
    ("inference_runtime", {"inference_runtime_model_source": "s3://b/m.pt",
                           "inference_runtime_model_checksum": "sha256:REPLACE"}, "sha256:REPLACE"),
    ("inference_runtime", {"inference_runtime_spot_watch": "gcp"}, "inference_runtime_spot_watch=gcp"),
    ("autostop", {}, None),
    ("autostop", {"autostop_idle_minutes": 0}, "autostop_idle_minutes=0"),
    ("autostop", {"autostop_check_interval": "often"}, "autostop_check_interval=often"),
]


@pytest.mark.parametrize(("role", "extra", "message"), CASES)
def test_assert(role: str, extra: dict, message: str | None, tmp_path: Path, tool_env: dict[str, str]) -> None:
    result = run_assert(tmp_path, tool_env, role, extra)
    output = result.stdout + result.stderr
    if message is None:
        assert result.returncode == 0, output[-3000:]
    else:
        assert result.returncode != 0, output[-3000:]
        assert message in output, output[-3000:]
        assert "allowed" in output.lower() or "Allowed" in output, output[-3000:]
