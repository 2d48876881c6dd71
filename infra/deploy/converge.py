"""The converge stage: playbooks/site.yml and verify.yml through ansible-runner.

`run_playbook` runs one playbook of this repository against an inventory folder (the stack's
`inventories/<stack>/`, or the demo's), with the repository's ansible.cfg, renders its event
stream as a per-host progress display (infra.deploy.progress.HostProgress) and keeps
ansible-runner's artifacts (every event as JSON, the full stdout, rc, status) under
`<run_dir>/ansible/artifacts/<playbook>/`. A failed or unreachable host raises a `StageError`
naming the host, the task and the task's message; the roles are idempotent, so the fix is to
re-run. `hosts_in` lists an inventory's hosts as Ansible resolves them (group_vars applied)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner

from infra.deploy.progress import Console, HostProgress, shown
from infra.deploy.stage import StageError
from infra.inventory import GROUP
from infra.matrix import REPO_ROOT

BIN = Path(sys.executable).parent
PLAYBOOK_TIMEOUT_S = 3 * 3600  # a driver build on a cold GPU node takes long; never forever


def ansible_env() -> dict[str, str]:
    """The repository's ansible.cfg, the venv's tools first on PATH, no colour codes."""
    return {
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_HOST_PATTERN_MISMATCH": "ignore",
        # ansible-runner turns host key checking off unless told otherwise; ansible.cfg keeps it
        # on (the inventories accept a new node's key once and refuse a changed one).
        "ANSIBLE_HOST_KEY_CHECKING": "True",
    }


@dataclass
class PlaybookResult:
    playbook: str
    stats: dict[str, dict[str, int]]
    artifacts: Path

    def changed(self) -> int:
        return sum(s.get("changed", 0) for s in self.stats.values())


def hostvars(inventory_dir: Path) -> dict[str, dict[str, Any]]:
    """Each host of group gpu_nodes with its variables as Ansible merges them (host vars over
    group_vars); Jinja is not rendered (the connection variables the stages read are plain)."""
    binary = BIN / "ansible-inventory"
    out = subprocess.run(
        [
            str(binary if binary.exists() else "ansible-inventory"),
            "-i",
            str(inventory_dir),
            "--list",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **ansible_env()},
        cwd=REPO_ROOT,
    )
    if out.returncode != 0:
        raise StageError(
            "inventory",
            f"ansible-inventory cannot read {inventory_dir}",
            details=out.stderr.strip().splitlines()[-6:],
            fix="fix the inventory (see the error), then re-run",
        )
    data = json.loads(out.stdout)
    hosts = data.get(GROUP, {}).get("hosts", [])
    meta = data.get("_meta", {}).get("hostvars", {})
    return {h: meta.get(h, {}) for h in hosts}


def run_playbook(
    playbook: str,
    inventory_dir: Path,
    run_dir: Path,
    console: Console,
    hosts: list[str],
    private_key: str | None = None,
    extravars: dict[str, Any] | None = None,
) -> PlaybookResult:
    """Run playbooks/<playbook> (or a playbook at an absolute path)."""
    name = Path(playbook).stem
    private = run_dir / "ansible"
    private.mkdir(parents=True, exist_ok=True)
    progress = HostProgress(console, playbook, hosts)
    cmdline = f"--private-key {private_key}" if private_key else None
    with progress:
        runner = ansible_runner.run(
            private_data_dir=str(private),
            ident=name,
            project_dir=str(REPO_ROOT),
            playbook=str(REPO_ROOT / "playbooks" / playbook),  # an absolute path stays one
            inventory=str(inventory_dir),
            envvars=ansible_env(),
            extravars=extravars or {},
            cmdline=cmdline,
            quiet=True,
            suppress_env_files=True,  # no copy of the environment (tokens) in the artifacts
            event_handler=progress.on_event,
            timeout=PLAYBOOK_TIMEOUT_S,
        )
    artifacts = private / "artifacts" / name
    for line in progress.recap():
        console.line(line)
    if runner.status != "successful" or runner.rc != 0:
        failure = progress.failures[0] if progress.failures else None
        details = [f"artifacts: {shown(artifacts)} (stdout, job_events/)"]
        if failure:
            details = [*failure.message.splitlines()[1:6], *details]
            raise StageError(
                "converge",
                f"{playbook} failed: {failure.message.splitlines()[0]}",
                host=failure.host,
                task=failure.task,
                details=details,
                fix="fix the cause above and re-run the same command: the roles are "
                "idempotent, converged hosts report changed=0",
            )
        tail = (runner.stdout.read() if runner.stdout else "").strip().splitlines()[-6:]
        raise StageError(
            "converge",
            f"{playbook} ended {runner.status} (rc {runner.rc})",
            details=[*tail, *details],
            fix="see the playbook's stdout in the artifacts, then re-run",
        )
    return PlaybookResult(playbook, progress.stats, artifacts)
