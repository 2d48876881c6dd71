"""The scaling group's lifecycle hooks: heartbeats while a node configures itself, completing
the launch action once /readyz answers 200 (or abandoning it on failure), and the watcher that
takes a leaving node (the group terminates it, or a spot notice came) out of its load balancer,
then drains it (leave.py), before it lets the group take it. infra/lifecycle.py derives the
hooks' timeouts from HEARTBEAT_S and WATCH_POLL_S."""

from __future__ import annotations

import threading
import time
from typing import Literal, Sequence, cast

from . import boot
from .boot import NodeConfig
from .cloud import Cloud, Identity, cloud_of
from .leave import SETTLE_S, leave_then_drain
from .local import open_runtime, runtime_url
from .state import State

RUNTIME = "torchfleet-runtime.service"
Hook = Literal["launch_hook", "terminate_hook"]
# Seconds between launch-hook heartbeats, and between the terminating watcher's looks at the
# lifecycle state (IMDS is local; ESS is an API call).
HEARTBEAT_S = 120
WATCH_POLL_S = {"aws": 5, "alicloud": 15}
READY_TIMEOUT_S = 900


def wait_ready(cfg: NodeConfig, timeout: float = READY_TIMEOUT_S) -> None:
    url = runtime_url(cfg, "/readyz")
    deadline = time.time() + timeout
    while True:
        try:
            with open_runtime(cfg, "/readyz") as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.time() > deadline:
            raise boot.Failure("ready-wait", f"{url} did not answer 200 within {timeout:.0f} s")
        time.sleep(2)


def heartbeats(cfg: NodeConfig, cloud: Cloud, ident: Identity, stop: threading.Event) -> None:
    """Keep the launch action alive while a slow node configures itself."""
    while not stop.wait(HEARTBEAT_S):
        try:
            cloud.heartbeat(cfg["launch_hook"] or "", ident["instance_id"])
        except Exception as err:  # a missed heartbeat is not a failed node
            boot.log(f"lifecycle heartbeat failed: {err}")


def complete(
    cfg: NodeConfig, cloud: Cloud, ident: Identity, hook: Hook, result: str, state: State
) -> None:
    """Complete this node's pending action of `hook` ("launch_hook" or "terminate_hook") with
    `result`, when the node belongs to a group that launched it through that hook."""
    name = cfg.get(hook)
    if not (cfg.get("group_name") and name and ident.get("target")):
        return
    try:
        cloud.lifecycle(name, result, ident["instance_id"])
    except Exception as err:
        if result == "CONTINUE":
            raise boot.Failure("lifecycle", f"completing {name} failed: {err}") from err
        boot.log(
            f"could not {result} {name} ({err}): the hook's default result applies at its timeout"
        )
        return
    boot.log(f"lifecycle {name} -> {result}")
    state.update(lifecycle=dict(state["lifecycle"] or {}, **{name: result}))


def leave(cfg: NodeConfig, cloud: Cloud, ident: Identity, why: str, state: State) -> None:
    """Out of the load balancer, then drain the runtime (systemctl stop: SIGTERM drains it)."""
    state.update(state="terminating", leaving=why)
    leave_then_drain(
        cloud.balancer(ident["instance_id"]),
        lambda: boot.run(["systemctl", "stop", RUNTIME]),
        SETTLE_S[cfg["cloud"]],
        why,
    )


def lifecycle_watch(_argv: Sequence[str]) -> int:
    """terminating, or a spot notice -> leave the load balancer, drain the runtime -> CONTINUE
    the terminating action (a spot node is taken by the cloud); a running warm-pool node put in
    service -> CONTINUE its launch action."""
    cfg = boot.load_config()
    if not cfg:
        boot.log(f"no {boot.CONFIG}: nothing to watch")
        return 1
    cloud = cloud_of(cfg)
    while True:
        try:
            target, state = cloud.target_state(), State()
            ident = cast(Identity, dict(state["identity"] or {}, target=target))
            notice = cloud.spot_notice() if target != "Terminated" else None
            if notice:
                leave(cfg, cloud, ident, f"spot notice ({notice.strip()[:120]})", state)
                return 0
            if target == "Terminated":
                leave(cfg, cloud, ident, "terminating", state)
                complete(cfg, cloud, ident, "terminate_hook", "CONTINUE", state)
                return 0
            if target == "InService" and state["state"] == "warmed":
                wait_ready(cfg)
                complete(cfg, cloud, ident, "launch_hook", "CONTINUE", state)
                state.update(state="ready", stage="ready", finished=boot.now())
        except Exception as err:
            boot.log(f"lifecycle watch: {err}")
        time.sleep(WATCH_POLL_S[cfg["cloud"]])
