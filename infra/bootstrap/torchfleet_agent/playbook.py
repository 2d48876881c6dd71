"""Ansible on the node itself: its venv (pinned ansible-core for the Python that runs it), a
bundle playbook against this node, and whether the play left a reboot to do. The failing task
comes from the bundle's callback plugin (torchfleet_status), not from parsing Ansible's output."""

from __future__ import annotations

import os
import shutil
import sys
import time

from . import boot
from .state import State

VENV = "/opt/torchfleet/ansible/venv"
REBOOT_FLAG = "/run/reboot-required"
# The Ansible venv's pins by the Python that runs Ansible (the node is its own controller):
# ansible-core 2.17 needs >= 3.10, 2.19 >= 3.11; the roles need ansible.builtin.systemd_service
# (>= 2.14), so 3.9 gets 2.15 and 3.8 is no controller (controller() installs python3.9).
# Resolved by pip on each Python (cryptography wants typing-extensions below 3.11).
_COMMON = (
    "jinja2==3.1.6 markupsafe==3.0.4 python-dateutil==2.9.0.post0 six==1.17.0 jmespath==1.1.0 "
)
PINS: dict[tuple[int, int], str] = {
    (3, 9): _COMMON + "ansible-core==2.15.13 resolvelib==1.0.1 packaging==26.3 pyyaml==6.0.3 "
    "cryptography==50.0.2 cffi==2.0.0 pycparser==2.23 importlib-resources==5.0.7 "
    "typing-extensions==4.16.0",
    (3, 10): _COMMON + "ansible-core==2.17.14 resolvelib==1.0.1 packaging==26.4 pyyaml==6.0.4 "
    "cryptography==50.0.2 cffi==2.1.1 pycparser==3.11 typing-extensions==4.16.0",
    (3, 11): _COMMON + "ansible-core==2.19.14 resolvelib==1.2.1 packaging==26.4 pyyaml==6.0.4 "
    "cryptography==50.0.2 cffi==2.1.1 pycparser==3.12",
}
PINS[(3, 12)] = PINS[(3, 13)] = PINS[(3, 11)]


def pins(version: tuple[int, int]) -> list[str]:
    """The Ansible venv's requirements for a controller Python (major, minor)."""
    if version not in PINS:
        known = ", ".join(f"{a}.{b}" for a, b in sorted(PINS))
        raise boot.Failure(
            "venv",
            f"Python {version[0]}.{version[1]} cannot run the pinned ansible-core (supported: {known})",
        )
    return PINS[version].split()


def controller() -> tuple[str, tuple[int, int]]:
    """The Python that runs Ansible: python3 when the pins cover it, else python3.9 from the
    archive (Ubuntu 20.04's 3.8)."""
    version = (sys.version_info[0], sys.version_info[1])
    if version in PINS:  # the interpreter behind the bootstrap venv's python
        return os.path.realpath(sys.executable), version
    if version < (3, 9) and boot.apt_install(["python3.9", "python3.9-venv"]):
        return "/usr/bin/python3.9", (3, 9)
    pins(version)  # raises the explanation
    raise AssertionError(version)


def ensure_venv(cfg: boot.NodeConfig) -> None:
    python, version = controller()
    boot.ensure_venv(python, version, VENV, pins(version), cfg.get("pip_args") or [])


def run(tree: str, inventory: str, playbook: str, state: State) -> None:
    """Run a bundle playbook on this node; record it in the state file; a failure names the task."""
    status = os.path.join(boot.WORK, "ansible-status.json")
    if os.path.exists(status):
        os.remove(status)
    env = dict(
        os.environ,
        ANSIBLE_ROLES_PATH=os.path.join(tree, "roles"),
        ANSIBLE_MODULE_UTILS=boot.compat_dir(tree),
        ANSIBLE_CALLBACK_PLUGINS=os.path.join(tree, "bootstrap", "callback_plugins"),
        ANSIBLE_CALLBACKS_ENABLED="torchfleet_status",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_HOME=boot.WORK + "/ansible",
        ANSIBLE_LOCAL_TEMP=boot.WORK + "/ansible/tmp",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        ANSIBLE_NO_TARGET_SYSLOG="1",
        TORCHFLEET_STATUS_FILE=status,
        HOME="/root",
        PATH=VENV + "/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    )
    for private in ("ANSIBLE_CONFIG", "PYTHONPATH", "TORCHFLEET_BOOT_STARTED"):
        env.pop(private, None)  # the agent's own, not the play's
    started = time.time()
    rc = boot.run(
        [
            VENV + "/bin/ansible-playbook",
            "-i",
            inventory,
            "-e",
            f"@{boot.WORK}/node-vars.json",
            os.path.join(tree, "playbooks", playbook),
        ],
        env=env,
        cwd=tree,
    ).returncode
    report = boot.read_json(status, {}) or {}
    state.update(
        plays=[
            *(state["plays"] or []),
            {
                "playbook": playbook,
                "rc": rc,
                "seconds": round(time.time() - started, 1),
                "stats": report.get("stats"),
            },
        ]
    )
    if rc != 0:
        failed = report.get("failed") or {}
        task = failed.get("task") or report.get("task") or "unknown (see the journal)"
        raise boot.Failure(
            "site",
            f"{playbook} failed at task '{task}': {failed.get('msg', f'rc {rc}')}",
            task=task,
        )


def reboot_pending() -> str | None:
    """A reboot the configuration asked for: the distro's flag, or an NVIDIA driver installed
    but not loaded (the nvidia_driver role refuses to reboot a node from a local play)."""
    if os.path.exists(REBOOT_FLAG):
        return REBOOT_FLAG
    if (
        not os.path.exists("/proc/driver/nvidia/version")
        and shutil.which("modinfo")
        and boot.run(["modinfo", "-F", "version", "nvidia"], capture_output=True).returncode == 0
    ):
        return "the NVIDIA driver is installed but not loaded"
    return None
