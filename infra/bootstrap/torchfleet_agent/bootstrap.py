"""`bootstrap`: the node configures itself with the bundle the stub (boot.py) verified and
unpacked, and joins its group only when /readyz answers 200.

identity (metadata, the group's view) -> the Ansible venv -> inventory from the bundle's facts
-> playbooks/site.yml (cold, bake) or baked.yml (baked) against this node -> /readyz 200 ->
launch lifecycle action CONTINUE. Any failure: state failed, the stage and the failing task in
the journal and the state file, ABANDON. site.yml is idempotent, so a reboot (a new driver)
resumes by running it again from the top with the work already done skipped."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Sequence

from . import boot, image, inventory, lifecycle, playbook
from .boot import NodeConfig
from .cloud import Identity, cloud_of
from .state import State

CLOUD_INSTANCE_ID = "/var/lib/cloud/data/instance-id"
MAX_REBOOTS = 2


def this_machine(state: State) -> bool:
    """Whether the state file is this machine's (an image may carry its builder's)."""
    try:
        with open(CLOUD_INSTANCE_ID) as f:
            local = f.read().strip()
    except OSError:
        return True  # no cloud-init record to compare with
    found: str | None = (state["identity"] or {}).get("instance_id")
    return found == local


def start_watchers(cfg: NodeConfig) -> None:
    """Started by the bootstrap, never at boot on their own: a node leaving a stopped warm
    pool gets its launch action completed by the bootstrap, once."""
    if cfg.get("group_name"):
        boot.run(["systemctl", "start", *image.WATCHERS])


def _begin(cfg: NodeConfig, state: State) -> None:
    """This boot's run: a fresh bootstrap, or the one a reboot interrupted, resumed."""
    resumed = state["state"] == "running" and state["bundle_sha256"] == cfg["bundle_sha256"]
    started = float(os.environ.get("TORCHFLEET_BOOT_STARTED") or time.time())  # the stub's start
    fresh: dict[str, Any] = (
        {}
        if resumed
        else {
            "started": boot.now(),
            "started_epoch": started,
            "stages": {},
            "plays": [],
            "reboots": 0,
            "lifecycle": {},
        }
    )
    state.update(
        state="running",
        mode="baked" if state["state"] == "warmed" else cfg.get("mode", "cold"),
        bundle_sha256=cfg["bundle_sha256"],
        failed_task=None,
        error=None,
        finished=None,
        boots=(state["boots"] or 0) + 1 if resumed else 1,
        **fresh,
    )


def _configure(tree: str, hosts: str, state: State) -> None:
    """The play for this boot's mode; a baked image older than its bundle falls back to site.yml."""
    if state["mode"] != "baked":
        playbook.run(tree, hosts, "site.yml", state)
        return
    try:
        playbook.run(tree, hosts, "baked.yml", state)
    except boot.Failure as err:
        boot.log(f"baked path failed ({err.message}): running site.yml")
        state.update(baked_fallback=err.task)
        playbook.run(tree, hosts, "site.yml", state)


def bootstrap(_argv: Sequence[str]) -> int:
    cfg = boot.load_config()
    if not cfg:
        boot.log(f"no {boot.CONFIG}: nothing to do")
        return 1
    state = State()
    if (
        state["state"] == "ready"
        and state["bundle_sha256"] == cfg["bundle_sha256"]
        and this_machine(state)
    ):
        boot.log(f"already ready with bundle {cfg['bundle_sha256'][:12]}")
        start_watchers(cfg)
        return 0
    _begin(cfg, state)
    cloud = cloud_of(cfg)
    ident: Identity | None = None
    stop = threading.Event()
    try:
        state.stage("identity")
        ident = cloud.identity()
        state.update(identity=ident)
        boot.log(
            "instance {instance_id} ({instance_type}) in {region}, target {target}".format(**ident)
        )
        if cfg.get("launch_hook") and ident.get("target"):
            beats = threading.Thread(
                target=lifecycle.heartbeats, args=(cfg, cloud, ident, stop), daemon=True
            )
            beats.start()
        state.stage("venv")
        if os.listdir("/var/lib/dpkg/updates") if os.path.isdir("/var/lib/dpkg/updates") else []:
            boot.run(["dpkg", "--configure", "-a"])  # a reboot in the middle of a dpkg run
        playbook.ensure_venv(cfg)
        tree = boot.bundle_tree(cfg["bundle_sha256"])
        state.stage("facts")
        hosts = inventory.write_inventory(cfg, ident, tree)
        state.stage("site")
        try:
            _configure(tree, hosts, state)
        except boot.Failure as err:
            # A new NVIDIA driver stops a local play (nvidia_driver: "reboot by hand, then run
            # the playbook again"): that is what this unit does, not a failed node.
            if not playbook.reboot_pending() or (state["reboots"] or 0) >= MAX_REBOOTS:
                raise
            boot.log(f"{err.message}: a reboot is pending, the play resumes after it")
        why = playbook.reboot_pending()
        if why and (state["reboots"] or 0) < MAX_REBOOTS:
            state.update(reboots=(state["reboots"] or 0) + 1, reboot_reason=why)
            state.stage("reboot")
            boot.log(f"rebooting ({why}); this unit resumes the bootstrap on the next boot")
            boot.run(["systemctl", "reboot"])
            return 0
        if state["mode"] == "bake":
            state.stage("prepare-image")
            return image.prepare_image(state, cfg.get("poweroff", True))
        state.stage("ready-wait")
        lifecycle.wait_ready(cfg)
        stop.set()
        state.stage("lifecycle")
        lifecycle.complete(cfg, cloud, ident, "launch_hook", "CONTINUE", state)
        start_watchers(cfg)
        final = "warmed" if (ident.get("target") or "").startswith("Warmed:") else "ready"
        state.stage(final)
        state.update(
            state=final,
            finished=boot.now(),
            seconds=round(time.time() - state["started_epoch"], 1),
        )
        boot.log(f"{final} in {state['seconds']:.0f} s (mode {state['mode']})")
        return 0
    except Exception as exc:  # every failure is reported, named, and abandons the launch
        stop.set()
        failure = (
            exc
            if isinstance(exc, boot.Failure)
            else boot.Failure(state["stage"], f"{type(exc).__name__}: {exc}")
        )
        state.update(
            state="failed",
            stage=failure.stage,
            failed_task=failure.task,
            error=failure.message,
            finished=boot.now(),
        )
        boot.log(f"FAILED in stage {failure.stage}: {failure.message}")
        if ident:
            lifecycle.complete(cfg, cloud, ident, "launch_hook", "ABANDON", state)
        return 1
