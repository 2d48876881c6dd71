"""The converge stage with real ansible-runner runs (local connection, two inventory hosts, a
small playbook): the per-host progress display, the artifacts, and a failure that names the
host, the task and the task's message."""

from __future__ import annotations

import io
import sys

import pytest
import yaml

from infra.deploy import converge, progress
from infra.deploy.progress import Console
from infra.deploy.stage import StageError

PLAY = [
    {
        "name": "A small play",
        "hosts": "gpu_nodes",
        "gather_facts": False,
        "tasks": [
            {"name": "Say hello", "ansible.builtin.debug": {"msg": "hello"}},
            {"name": "Change something", "ansible.builtin.command": "true", "changed_when": True},
            {
                "name": "Fail on beta only",
                "ansible.builtin.command": "sh -c 'echo broken >&2; exit 3'",
                "when": "inventory_hostname == 'beta'",
            },
            {"name": "Run after the failure", "ansible.builtin.debug": {"msg": "still here"}},
        ],
    }
]


@pytest.fixture
def inventory_dir(tmp_path):
    folder = tmp_path / "inventory"
    folder.mkdir()
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (folder / "hosts.yml").write_text(
        yaml.safe_dump(
            {"all": {"children": {"gpu_nodes": {"hosts": {"alpha": local, "beta": local}}}}}
        )
    )
    return folder


@pytest.fixture
def playbook(tmp_path):
    path = tmp_path / "small.yml"
    path.write_text(yaml.safe_dump(PLAY, sort_keys=False))
    return str(path)


def test_hostvars_resolves_the_inventory_as_ansible_does(inventory_dir):
    (inventory_dir / "group_vars").mkdir()
    (inventory_dir / "group_vars" / "gpu_nodes.yml").write_text("ansible_port: 2222\n")
    hosts = converge.hostvars(inventory_dir)
    assert sorted(hosts) == ["alpha", "beta"]
    assert hosts["alpha"]["ansible_port"] == 2222 and hosts["beta"]["ansible_connection"] == "local"


def test_a_failing_task_is_named_with_its_host_and_message(
    inventory_dir, playbook, tmp_path, console, text, monkeypatch
):
    monkeypatch.setattr(progress, "SLOW_TASK_S", 0.0)  # a line for every finished task
    with pytest.raises(StageError) as info:
        converge.run_playbook(playbook, inventory_dir, tmp_path / "run", console, ["alpha", "beta"])
    err = info.value
    assert (err.stage, err.host, err.task, err.exit_code) == (
        "converge",
        "beta",
        "Fail on beta only",
        6,
    )
    assert "non-zero return code" in err.message
    assert any("broken" in d for d in err.details)  # the task's stderr
    artifacts = tmp_path / "run" / "ansible" / "artifacts" / "small"
    assert (artifacts / "stdout").exists() and any((artifacts / "job_events").iterdir())
    shown = " ".join(text(console).split())  # columns collapsed
    assert "beta FAILED Fail on beta only: non-zero return code" in shown
    assert "alpha ok=3 changed=1 failed=0 unreachable=0 skipped=1" in shown  # the recap
    assert "beta ok=2 changed=1 failed=1" in shown
    assert "alpha Run after the failure: ok" in shown
    assert "beta Run after the failure" not in shown  # a failed host stops
    assert "TASK [" not in shown  # no wall of Ansible output without -v


def test_success_returns_the_recap_and_verbose_shows_ansibles_output(inventory_dir, tmp_path, text):
    play = [{**PLAY[0], "tasks": PLAY[0]["tasks"][:2]}]
    path = tmp_path / "ok.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    loud = Console(io.StringIO(), verbose=True, live=False)
    result = converge.run_playbook(
        str(path), inventory_dir, tmp_path / "run", loud, ["alpha", "beta"]
    )
    assert result.stats["alpha"]["changed"] == 1 and result.changed() == 2
    assert "TASK [Change something]" in text(loud)


def test_the_live_display_redraws_one_line_per_host(inventory_dir, playbook, tmp_path, text):
    live = Console(io.StringIO(), live=True)
    with pytest.raises(StageError):
        converge.run_playbook(playbook, inventory_dir, tmp_path / "run", live, ["alpha", "beta"])
    shown = text(live)
    assert "\x1b[2F\x1b[J" in shown  # cursor up over the two host lines, clear, redraw
    last_block = shown.rsplit("\x1b[J", 1)[1]
    assert "alpha" in last_block or "beta" in last_block
