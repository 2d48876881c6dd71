"""The inference_runtime role installs the runtime's `gpu` extra (nvidia-ml-py: the NVML gauges
the node agent publishes for GPU scaling) where preflight found a GPU, and nowhere else.

What Ansible itself decides from the role's defaults and vars, run through ansible-playbook on
localhost: the extras, the pip requirement of the runtime wheel and the installed-wheels marker
(which must change when a node gains the extra, or nothing reinstalls). The install itself is
converged for real by the Molecule scenarios (tests/roles/molecule/: `legacy` installs the extra
on a GPU-less node and verifies nvidia-ml-py in the venv; `site` verifies it is absent)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "inference_runtime"


def decide(
    tmp_path: Path, env: dict[str, str], facts: dict, spec: str, extras: list | None
) -> None:
    """Assert, inside Ansible (the assert action runs on the controller), what the role's
    defaults and vars make of `facts`."""
    that = ["__inference_runtime_extras_spec == expected_spec"]
    if extras is not None:
        that.append("inference_runtime_extras == expected_extras")
    play = [
        {
            "name": "what the role decides",
            "hosts": "localhost",
            "gather_facts": False,
            "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
            "vars": {"expected_spec": spec, "expected_extras": extras},
            "tasks": [{"ansible.builtin.assert": {"that": that}}],
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    done = subprocess.run(
        # the facts as extra vars: above vars_files, as preflight's facts and inventory values
        # are above a role's defaults
        [
            "ansible-playbook",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            json.dumps(facts),
            str(playbook),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


@pytest.mark.parametrize(
    ("facts", "extras", "spec"),
    [
        ({"torchfleet_gpu_present": True}, ["gpu"], "[gpu]"),
        ({"torchfleet_gpu_present": False}, [], ""),
        ({}, [], ""),  # without preflight's fact: no GPU assumed
        (
            {"torchfleet_gpu_present": True, "inference_runtime_extras": ["onnx", "gpu"]},
            None,
            "[gpu,onnx]",
        ),
    ],
)
def test_the_gpu_extra_goes_where_a_gpu_is(tmp_path, tool_env, facts, extras, spec):
    decide(tmp_path, tool_env, facts, spec, extras)
