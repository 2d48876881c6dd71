"""Molecule scenarios: converge playbooks/site.yml in systemd containers, check idempotence,
verify real state (service, /readyz, a prediction, pins/blacklists, autostop, preflight's
refusal), destroy.

  site    Debian 12, Python 3.11, profile cpu, torch 2.13.0 CPU
  legacy  Debian 11, Python 3.9, cu116 stack with PyPI torch 1.12.1 and numpy<2
  monitoring  Debian 12 as the monitoring host and a node shipping its journal to it

Images come from scripts/build_image.sh (built when missing), wheels from host wheelhouses
(tests/roles/prepare_wheelhouse.sh; downloaded once into .cache/). Each scenario prints its
per-step times; TORCHFLEET_MOLECULE_KEEP=1 keeps the instance for debugging (molecule
--destroy never).

Ansible reaches the node over SSH, as in production: the container's sshd is published on a free
127.0.0.1 port (TORCHFLEET_MOLECULE_SSH_PORT, picked here) and root logs in with a throwaway key
kept in .cache/molecule/ssh/ (made here when missing, mounted as root's authorized_keys)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from infra.deploy.access import free_loopback_port
from infra.deploy.containers import ensure_ssh_key, missing_tools

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# The scenarios' molecule.yml mount this key's .pub as root's authorized_keys and log in with it.
SSH_KEY = REPO / ".cache" / "molecule" / "ssh" / "id_ed25519"

SCENARIOS = {
    # scenario: (image suite, wheelhouse ABI)
    "site": ("bookworm", "cp311"),
    "legacy": ("bullseye", "cp39"),
    "monitoring": ("bookworm", "cp311"),  # roles/monitoring: playbooks/monitoring.yml
}
# `molecule test`'s sequence, run step by step so each step's time is measured and a failure
# names its step. destroy always runs at the end (unless TORCHFLEET_MOLECULE_KEEP=1).
STEPS = ("create", "prepare", "converge", "idempotence", "verify")


def _run(
    cmd: list[str], env: dict[str, str], cwd: Path, timeout: int
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.molecule
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param("site"),
        pytest.param("legacy", marks=pytest.mark.legacy),
        pytest.param("monitoring"),
    ],
)
def test_scenario(scenario: str, tool_env: dict[str, str]) -> None:
    missing = missing_tools("podman", "runc", "ssh", "ssh-keygen")
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: run `make setup` (it installs podman, "
            "runc, debootstrap, openssh-client)"
        )
    suite, abi = SCENARIOS[scenario]
    env = dict(tool_env)
    env["MOLECULE_EPHEMERAL_DIRECTORY"] = str(REPO / ".cache" / "molecule" / scenario)
    # Molecule uses its own ansible.cfg-less setup; the scenario's molecule.yml sets the rest.
    env.pop("ANSIBLE_CONFIG", None)
    # Snapshots of runtime/ and compat/ for the whole scenario (see TORCHFLEET_RUNTIME_SOURCE and
    # TORCHFLEET_COMPAT_SOURCE in molecule.yml).
    for name in ("runtime", "compat"):
        snapshot = REPO / ".cache" / "molecule" / f"{scenario}-{name}-src"
        shutil.rmtree(snapshot, ignore_errors=True)
        shutil.copytree(
            REPO / name,
            snapshot,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".ruff_cache"),
        )
        env[f"TORCHFLEET_{name.upper()}_SOURCE"] = str(snapshot)
    ensure_ssh_key(SSH_KEY)  # the throwaway key (shared with the demo's container nodes)
    # podman publishes the node's sshd on a port the kernel picked: nothing collides
    env["TORCHFLEET_MOLECULE_SSH_PORT"] = str(free_loopback_port())

    # The scenario's container name is fixed (molecule.yml): two checkouts on one machine (git
    # worktrees, a person beside CI) run the same scenario one after the other, not on top of
    # each other.
    lock = open(f"/tmp/torchfleet-molecule-{scenario}.lock", "w")  # noqa: SIM115 - held to the end
    fcntl.flock(lock, fcntl.LOCK_EX)
    image = _run(["bash", str(REPO / "scripts" / "build_image.sh"), suite], env, REPO, 900)
    assert image.returncode == 0, f"image build failed:\n{(image.stdout + image.stderr)[-3000:]}"
    wheels = _run(["bash", str(HERE / "prepare_wheelhouse.sh"), abi], env, REPO, 1800)
    assert wheels.returncode == 0, f"wheelhouse failed:\n{(wheels.stdout + wheels.stderr)[-3000:]}"

    log = REPO / ".cache" / "molecule" / f"{scenario}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    with log.open("w") as out:

        def molecule(step: str, label: str = "") -> subprocess.CompletedProcess[str]:
            started = time.monotonic()
            result = _run(["molecule", step, "-s", scenario], env, HERE, 1500)
            label = label or step
            times[label] = time.monotonic() - started
            out.write(
                f"===== molecule {step} -s {scenario} ({label}): rc={result.returncode} "
                f"{times[label]:.0f} s\n{result.stdout}{result.stderr}\n"
            )
            out.flush()
            return result

        molecule("destroy", "cleanup")  # a leftover instance from an interrupted run
        try:
            for step in STEPS:
                result = molecule(step)
                assert result.returncode == 0, (
                    f"molecule {step} -s {scenario} failed (full log {log}):\n"
                    f"{(result.stdout + result.stderr)[-8000:]}"
                )
        finally:
            if not os.environ.get("TORCHFLEET_MOLECULE_KEEP"):
                molecule("destroy")
            print(
                f"\nmolecule -s {scenario}: "
                + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
            )
