"""Bad input fails early with a message naming the variable, the value and what is allowed.

Runs each role's tasks/assert.yml on localhost (no container needed) through ansible-playbook,
and, for what a role's meta/argument_specs.yml enforces itself (types, choices), the same
validation Ansible runs when the role starts (validate_argument_spec with the role's spec)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROFILE = {"torch": "2.13.0", "torchvision": None, "cuda": None, "wheel_index": None}
# A token, so that the role's default host (all addresses) is allowed to serve predictions.
TOKEN = {"inference_runtime_api_token": "role-assert-token-0123456789"}
# What the role says when a network bind has no token (the runtime's own rule, named in role terms).
NO_TOKEN = "is invalid (predictions on a non-loopback address with no API token)"


def run_assert(
    tmp_path: Path, env: dict[str, str], role: str, extra: dict
) -> subprocess.CompletedProcess[str]:
    play = [
        {
            "name": "assert",
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"torchfleet_profile": PROFILE, "torchfleet_python_version": "3.11", **extra},
            "tasks": [{"ansible.builtin.include_role": {"name": role, "tasks_from": "assert.yml"}}],
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    env = dict(env, ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    return subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


# What roles/monitoring's tasks/main.yml sets from the distro's vars before its asserts run.
MONITORING_DISTRO = {
    "__monitoring_unsupported": "",
    "__monitoring_prometheus_pin": "2.42.0+ds-5+b5",
    "__monitoring_alertmanager_pin": "0.25.0-2+b5",
    "ansible_facts": {"distribution": "Debian", "distribution_major_version": "12"},
}

CASES = [
    ("pytorch", {}, None),
    ("pytorch", {"pytorch_wheelhouse": "relative/dir"}, "pytorch_wheelhouse=relative/dir"),
    ("pytorch", {"pytorch_index_url": "mirror.example"}, "pytorch_index_url=mirror.example"),
    ("pytorch", {"pytorch_torch_version": "latest"}, "pytorch_torch_version=latest"),
    ("inference_runtime", TOKEN, None),
    ("inference_runtime", {}, "inference_runtime_host = '0.0.0.0' " + NO_TOKEN),
    ("inference_runtime", {"inference_runtime_host": "127.0.0.1"}, None),
    ("inference_runtime", {"inference_runtime_host": "::1"}, None),
    ("inference_runtime", {"inference_runtime_allow_unauthenticated": True}, None),
    ("inference_runtime", {"inference_runtime_api_token_command": ["torchfleet-node"]}, None),
    ("inference_runtime", {"inference_runtime_config": {"api_token_file": "/etc/t"}}, None),
    (
        "inference_runtime",
        {"inference_runtime_host": "127.0.0.1", "inference_runtime_config": {"host": "10.0.0.5"}},
        "inference_runtime_config.host = '10.0.0.5' " + NO_TOKEN,
    ),
    (
        "inference_runtime",
        {"inference_runtime_config": {"allow_unauthenticated": "maybe"}},
        "inference_runtime_config.allow_unauthenticated = 'maybe' is invalid",
    ),
    ("inference_runtime", {"inference_runtime_config": {"max_batch": 8}}, "max_batch"),
    (
        "inference_runtime",
        {"inference_runtime_model_source": "https://example.invalid/m.pt"},
        "inference_runtime_model_source=https://example.invalid/m.pt",
    ),
    (
        "inference_runtime",
        {
            "inference_runtime_model_source": "s3://b/m.pt",
            "inference_runtime_model_checksum": "sha256:REPLACE",
        },
        "sha256:REPLACE",
    ),
    ("autostop", {}, None),
    ("autostop", {"autostop_idle_minutes": 0}, "autostop_idle_minutes=0"),
    ("autostop", {"autostop_check_interval": "often"}, "autostop_check_interval=often"),
    ("monitoring", {**MONITORING_DISTRO, "torchfleet_cloud": "aws"}, None),
    (
        "monitoring",
        {**MONITORING_DISTRO, "torchfleet_cloud": "aws", "monitoring_spend_days": 0},
        "monitoring_spend_days=0",
    ),
    (
        "monitoring",
        {**MONITORING_DISTRO, "torchfleet_cloud": "alicloud", "monitoring_spend_region": ""},
        "monitoring_spend_region=''",
    ),
]


@pytest.mark.parametrize(("role", "extra", "message"), CASES)
def test_assert(
    role: str, extra: dict, message: str | None, tmp_path: Path, tool_env: dict[str, str]
) -> None:
    result = run_assert(tmp_path, tool_env, role, extra)
    output = result.stdout + result.stderr
    if message is None:
        assert result.returncode == 0, output[-3000:]
    else:
        assert result.returncode != 0, output[-3000:]
        assert message in output, output[-3000:]
        assert "allowed" in output.lower() or "Allowed" in output, output[-3000:]


SPEC_CASES = [
    ("inference_runtime", {"inference_runtime_spot_watch": "gcp"}, "inference_runtime_spot_watch"),
    ("inference_runtime", {"inference_runtime_precision": "int8"}, "inference_runtime_precision"),
    ("nvidia_driver", {"nvidia_driver_source": "vendor"}, "nvidia_driver_source"),
    ("cuda", {"cuda_install_method": "pip"}, "cuda_install_method"),
    ("autostop", {"autostop_enabled": "sometimes"}, "autostop_enabled"),
]


@pytest.mark.parametrize(("role", "extra", "name"), SPEC_CASES)
def test_argument_specs_refuse_what_no_assert_restates(
    role: str, extra: dict, name: str, tmp_path: Path, tool_env: dict[str, str]
) -> None:
    spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    play = [
        {
            "name": "spec",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.validate_argument_spec": {
                        "argument_spec": {name: options[name]},
                        "provided_arguments": extra,
                    }
                }
            ],
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    result = subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook)],
        cwd=tmp_path,
        env=tool_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert name in output and str(extra[name]) in output, output[-3000:]
    # and the role's own asserts no longer restate the rule
    tasks = yaml.safe_load((REPO / "roles" / role / "tasks" / "assert.yml").read_text())
    conditions = [
        str(t["ansible.builtin.assert"]["that"]) for t in tasks if "ansible.builtin.assert" in t
    ]
    assert conditions and not any(name in c for c in conditions)
