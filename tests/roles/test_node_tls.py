"""The inference_runtime role's side of `tls.backend` (infra/edge.py), without a container: the
argv its tls task runs, as Ansible renders it from the role's defaults and a tls.backend stack's
inventory variables (infra/inventory.py), and the runtime configuration those variables give.
That the agent's `node-tls` command writes the files 0640 root:GROUP: tests/bootstrap/test_leave.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from infra import config
from infra.bootstrap.torchfleet_agent.local import NODE_TLS_CERT, NODE_TLS_KEY
from infra.inventory import group_vars
from infra.plan import load_stack_config

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "inference_runtime"


def _stack_vars(stack: str) -> dict:
    cfg = config.load(config.raw_from_pulumi_config(load_stack_config(stack)), stack)
    return group_vars(cfg, "admin")


def _tls_task() -> dict:
    (task,) = yaml.safe_load((ROLE / "tasks" / "tls.yml").read_text())
    return task


def test_the_tls_task_runs_the_nodes_command_with_the_runtimes_files(role_play, tmp_path):
    shared = _stack_vars("aws-prod")
    task = _tls_task()
    assert task["no_log"] is True and task["notify"] == "inference_runtime restart"
    assert task["when"] == "inference_runtime_tls_command | length > 0"
    out = tmp_path / "argv.json"
    role_play(
        "inference_runtime",
        [
            {
                "ansible.builtin.copy": {
                    "content": task["ansible.builtin.command"]["argv"]
                    .replace("{{", "{{ (")
                    .replace("}}", ") | to_json }}"),
                    "dest": str(out),
                    "mode": "0644",
                }
            }
        ],
        {k: v for k, v in shared.items() if k.startswith("inference_runtime_")},
    )
    assert json.loads(out.read_text()) == [
        *shared["inference_runtime_tls_command"],
        NODE_TLS_CERT,
        NODE_TLS_KEY,
        "torchfleet",
    ]


def test_the_runtime_serves_https_with_the_files_the_command_writes(render_templates):
    shared = _stack_vars("aws-prod")
    extra = {k: v for k, v in shared.items() if k.startswith("inference_runtime_")}
    extra["__inference_runtime_model_file"] = "/var/lib/torchfleet/models/model.pt"
    text = render_templates("inference_runtime", {"runtime": "runtime.yml.j2"}, extra)["runtime"]
    runtime = yaml.safe_load(text)
    assert runtime["tls_cert_file"] == NODE_TLS_CERT
    assert runtime["tls_key_file"] == NODE_TLS_KEY
    # in the role's configuration directory (0750 root:torchfleet)
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for path in (NODE_TLS_CERT, NODE_TLS_KEY):
        assert Path(path).parent == Path(defaults["inference_runtime_config_dir"])


def test_a_stack_without_backend_tls_sets_none_of_it():
    for stack in ("aws-dev", "alicloud-prod"):
        shared = _stack_vars(stack)
        # (the journal's HTTPS is another thing: tests/infra/test_journal_tls.py)
        assert not [k for k in shared if "_tls_" in k and not k.startswith("monitoring_")], stack
        assert "inference_runtime_tls_command" not in shared, stack
