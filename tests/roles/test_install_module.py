"""playbooks/library/torchfleet_install.py, the module the roles install their files and units
with: run as Ansible runs it (the module file with a JSON arguments file), against a temporary
tree, with a recording `systemctl` on PATH. The Molecule scenarios run it in real systemd."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "playbooks" / "library" / "torchfleet_install.py"

# A stand-in for systemctl: units named in $STATE/enabled and $STATE/active are enabled and
# active; every call is appended to $STATE/calls.
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$STATE/calls"
case "$1" in
  is-enabled) grep -qx "$2" "$STATE/enabled" 2>/dev/null ;;
  is-active) grep -qx "$2" "$STATE/active" 2>/dev/null ;;
  enable) echo "$2" >> "$STATE/enabled" ;;
  start|restart) echo "$2" >> "$STATE/active" ;;
  fail-me) exit 1 ;;
esac
"""


@pytest.fixture()
def node(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL)
    fake.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    return {"root": tmp_path / "root", "bin": bin_dir, "state": state}


def run(node: dict, args: dict, *, check: bool = False, diff: bool = False) -> dict:
    args = dict(args, _ansible_check_mode=check, _ansible_diff=diff)
    args_file = node["state"] / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PATH=f"{node['bin']}:{os.environ['PATH']}", STATE=str(node["state"]))
    proc = subprocess.run(
        [sys.executable, str(MODULE), str(args_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    result = json.loads(proc.stdout)
    assert (proc.returncode != 0) == bool(result.get("failed")), proc.stdout + proc.stderr
    return result


def calls(node: dict) -> list[str]:
    path = node["state"] / "calls"
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return [line for line in lines if not line.startswith(("is-enabled", "is-active"))]


def tree(node: dict) -> dict:
    root = node["root"]
    directory = root / "etc" / "app"
    return {
        "directories": [{"path": str(directory), "mode": "0750"}],
        "files": [
            {"dest": str(directory / "app.conf"), "content": "a = 1\n", "mode": "0640",
             "restarts": ["app.service"]},
            {"dest": str(directory / "tool.py"), "content": "print('x')\n", "mode": "0755"},
        ],
        "units": [{"name": "app.service", "enabled": True, "state": "started"}],
    }  # fmt: skip


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_run_installs_everything_and_a_second_changes_nothing(node: dict) -> None:
    spec = tree(node)
    first = run(node, spec)
    conf = Path(spec["files"][0]["dest"])
    assert first["changed"] is True
    assert first["directories"] == [spec["directories"][0]["path"]]
    assert first["files"] == [f["dest"] for f in spec["files"]]
    assert first["units"] == ["app.service enabled", "app.service started"]
    assert calls(node) == ["enable app.service", "start app.service"]
    assert conf.read_text() == "a = 1\n"
    assert mode_of(conf) == 0o640
    assert mode_of(conf.parent) == 0o750
    assert mode_of(Path(spec["files"][1]["dest"])) == 0o755

    second = run(node, spec)
    assert second["changed"] is False, second
    assert (second["files"], second["directories"], second["units"]) == ([], [], [])
    assert calls(node) == []


def test_a_changed_file_restarts_the_units_it_names_and_only_it_is_rewritten(node: dict) -> None:
    spec = tree(node)
    run(node, spec)
    calls(node)
    tool = Path(spec["files"][1]["dest"])
    inode = tool.stat().st_ino
    spec["files"][0]["content"] = "a = 2\n"
    result = run(node, spec)
    assert result["files"] == [spec["files"][0]["dest"]]
    assert result["units"] == ["app.service restarted"]
    assert calls(node) == ["restart app.service"]
    assert tool.stat().st_ino == inode  # untouched
    assert Path(spec["files"][0]["dest"]).read_text() == "a = 2\n"


def test_a_mode_change_alone_is_a_change_and_keeps_the_content(node: dict) -> None:
    spec = tree(node)
    run(node, spec)
    calls(node)
    conf = Path(spec["files"][0]["dest"])
    conf.chmod(0o666)
    result = run(node, spec)
    assert result["files"] == [str(conf)]
    assert mode_of(conf) == 0o640
    assert conf.read_text() == "a = 1\n"


def test_check_mode_reports_the_changes_and_writes_nothing(node: dict) -> None:
    spec = tree(node)
    result = run(node, spec, check=True, diff=True)
    assert result["changed"] is True
    assert result["files"] == [f["dest"] for f in spec["files"]]
    assert result["units"] == ["app.service enabled", "app.service started"]
    assert not node["root"].exists()
    assert calls(node) == []
    after = {d["after_header"]: d["after"] for d in result["diff"]}
    assert after[spec["files"][0]["dest"]] == "a = 1\n"


def test_disabled_units_are_stopped_and_disabled(node: dict) -> None:
    (node["state"] / "enabled").write_text("job.timer\n")
    (node["state"] / "active").write_text("job.timer\n")
    result = run(node, {"units": [{"name": "job.timer", "enabled": False, "state": "stopped"}]})
    assert result["units"] == ["job.timer disabled", "job.timer stopped"]
    assert calls(node) == ["disable job.timer", "stop job.timer"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mode": 420}, "mode 420 must be a quoted octal string"),
        ({"mode": "rw-r--r--"}, "must be a quoted octal string"),
        ({"owner": "no-such-user-x"}, "no user 'no-such-user-x' on the node"),
        ({"group": "no-such-group-x"}, "no group 'no-such-group-x' on the node"),
    ],
)
def test_bad_file_specs_fail_with_a_clear_message(node: dict, change: dict, message: str) -> None:
    spec = tree(node)
    spec["files"][0].update(change)
    result = run(node, spec)
    assert result["failed"] is True
    assert message in result["msg"], result["msg"]


def test_a_file_whose_directory_is_missing_is_refused_by_name(node: dict) -> None:
    dest = node["root"] / "nowhere" / "x.conf"
    result = run(node, {"files": [{"dest": str(dest), "content": "x", "mode": "0644"}]})
    assert result["failed"] is True
    assert f"the directory of {dest} does not exist" in result["msg"]


def test_a_failing_systemctl_fails_the_task_and_says_what_was_written(node: dict) -> None:
    spec = tree(node)
    (node["bin"] / "systemctl").write_text(
        '#!/bin/sh\ncase "$1" in start) exit 3 ;; enable) exit 0 ;; esac\nexit 1\n'
    )
    result = run(node, spec)
    assert result["failed"] is True
    assert "systemctl start app.service failed (rc 3)" in result["msg"]
    assert result["files"] == [f["dest"] for f in spec["files"]]


def test_every_role_links_the_one_module_file() -> None:
    """The roles that use the module link the canonical file (a git symlink, stored as content
    in the node bundle), so there is one copy to change."""
    links = sorted(REPO.glob("roles/*/library/torchfleet_install.py"))
    users = sorted(
        p.parent.parent.name
        for p in REPO.glob("roles/*/tasks/*.yml")
        if "torchfleet_install:" in p.read_text()
    )
    assert sorted(p.parent.parent.name for p in links) == sorted(set(users))
    for link in links:
        assert link.is_symlink(), link
        assert link.resolve() == MODULE, link
