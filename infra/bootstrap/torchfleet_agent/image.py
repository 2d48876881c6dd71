"""The bake: a configured node made into an image that any number of nodes boot from."""

from __future__ import annotations

import os
import shutil

from . import boot
from .lifecycle import RUNTIME
from .state import State

WATCHERS = ("torchfleet-lifecycle.service", "torchfleet-metrics.timer")
# What the bake removes or records (each path once, so tests can move them all elsewhere).
IMAGE_RECORD = "/etc/torchfleet/image.json"
MODELS = "/var/lib/torchfleet/models"
RUNTIME_CACHE = "/var/cache/torchfleet-runtime"
MACHINE_IDS: tuple[str, ...] = ("/etc/machine-id", "/var/lib/dbus/machine-id")
SSH_DIR = "/etc/ssh"
CLOUD_SEED = "/var/lib/cloud/seed"


def prepare_image(state: State | None = None, poweroff: bool = True) -> int:
    """Keep packages, venvs, torch and the runtime; drop the model and everything that makes a
    node unique (cloud-init's instance, machine-id, SSH host keys, this state); power off, or
    (an image builder captures a running machine) end with a state "ready" that names no
    instance, so no node booted from the image takes it for its own."""
    state = state or State()
    record = {k: state[k] for k in ("bundle_sha256", "mode", "started", "stages", "plays")}
    boot.run(["systemctl", "stop", *WATCHERS])
    boot.run(["systemctl", "disable", "--now", RUNTIME])  # a baked node starts it with its model
    for path in (MODELS, boot.WORK, RUNTIME_CACHE):
        shutil.rmtree(path, ignore_errors=True)
    boot.write_json(
        IMAGE_RECORD,
        {
            "baked": boot.now(),
            "bundle_sha256": state["bundle_sha256"],
            "from_instance": (state["identity"] or {}).get("instance_id"),
        },
    )
    for path in (boot.CONFIG, boot.STATE):
        if os.path.exists(path):
            os.remove(path)
    if shutil.which("cloud-init") and boot.run(["cloud-init", "clean", "--logs"]).returncode != 0:
        raise boot.Failure(
            "prepare-image",
            "cloud-init clean failed (see the journal): the image would "
            "not run cloud-init for the next instance",
        )
    shutil.rmtree(CLOUD_SEED, ignore_errors=True)  # a builder's NoCloud seed, unless mounted
    for path in MACHINE_IDS:
        if os.path.isfile(path) and not os.path.islink(path):
            open(path, "w").close()  # empty: systemd makes a new one on the first boot
    for name in os.listdir(SSH_DIR) if os.path.isdir(SSH_DIR) else []:
        if name.startswith("ssh_host_"):
            os.remove(os.path.join(SSH_DIR, name))
    boot.run(["journalctl", "--rotate"])
    boot.run(["journalctl", "--vacuum-time=1s"])
    if not poweroff:
        boot.write_json(boot.STATE, dict(record, state="ready", stage="baked", finished=boot.now()))
        boot.log("image prepared: ready for capture")
        return 0
    boot.log("image prepared: powering off")
    boot.run(["systemctl", "poweroff"])
    return 0
