"""The inference_runtime role's token timer, without a container: the units it installs, as
Ansible renders them from the role's own defaults, vars and templates, and `no_log` on every
task that reads or writes the API token. That the agent's `api-token` command replaces the file
only when the tokens changed: tests/bootstrap/test_leave.py. The timer converging on a booted
node: the Molecule and node-bootstrap scenarios (containers)."""

from __future__ import annotations

import configparser
import json
import shlex
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "inference_runtime"
SENTINEL = "sentinel-token-0123456789"  # given to the role: must appear in no unit


def render(render_templates, extra: dict) -> dict[str, configparser.ConfigParser]:
    units = {"service": "torchfleet-api-token.service.j2", "timer": "torchfleet-api-token.timer.j2"}
    texts = render_templates(
        "inference_runtime", units, {"inference_runtime_api_token": SENTINEL, **extra}
    )
    out = {}
    for kind, text in texts.items():
        assert SENTINEL not in text
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.read_string(text)
        out[kind] = parser
    return out


def test_the_timer_runs_the_nodes_token_command_at_the_refresh_interval(render_templates):
    units = render(
        render_templates,
        {
            "inference_runtime_api_token_command": ["/usr/local/sbin/torchfleet-node", "api-token"],
            "inference_runtime_api_token_refresh_s": 20,
        },
    )
    service, timer = units["service"], units["timer"]
    assert service["Service"]["Type"] == "oneshot"
    # the same argv the converge runs (tasks/token.yml): the file and the runtime's group appended
    assert shlex.split(service["Service"]["ExecStart"]) == [
        "/usr/local/sbin/torchfleet-node",
        "api-token",
        "/etc/torchfleet/api-tokens",
        "torchfleet",
    ]
    assert timer["Timer"]["OnUnitActiveSec"] == timer["Timer"]["OnActiveSec"] == "20s"
    assert timer["Install"]["WantedBy"] == "timers.target"  # enabled: it survives a reboot


def _tasks(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text()) or []


def test_the_timer_is_installed_only_for_a_token_command_with_an_interval():
    timer = [t for t in _tasks(ROLE / "tasks" / "token.yml") if "torchfleet_install" in t]
    assert len(timer) == 1
    assert timer[0]["when"] == [
        "inference_runtime_api_token_command | length > 0",
        "inference_runtime_api_token_refresh_s | int > 0",
    ]
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    option = spec["argument_specs"]["main"]["options"]["inference_runtime_api_token_refresh_s"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert option["default"] == defaults["inference_runtime_api_token_refresh_s"] > 0


# What a task holds when it reads or writes a token: the token variable, the role's own header,
# the file read back, the command that writes the file.
TOKEN_NAMES = (
    "inference_runtime_api_token ",
    "inference_runtime_api_token }",
    "__inference_runtime_auth",
    "__inference_runtime_token_read",
    "api_token_command +",
)


def test_every_task_that_touches_the_token_has_no_log():
    touching = []
    for path in sorted((ROLE / "tasks").glob("*.yml")) + [ROLE / "handlers" / "main.yml"]:
        for task in _tasks(path):
            acts = json.dumps({k: v for k, v in task.items() if k not in ("when", "no_log")})
            if any(name in acts for name in TOKEN_NAMES):
                touching.append((path.name, task["name"], task.get("no_log")))
    assert len(touching) >= 4, touching  # the read, the write, the role's own requests
    assert [t for t in touching if not t[2]] == []
