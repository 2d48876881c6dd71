"""When a node the cloud starts counts as ready, when it may leave, and how long each path to
ready takes: the figures behind every hook timeout, grace period and warm-up in infra/.

Contract:
- The load balancer health check (`LB_*`), the metric period and the deregistration delay are
  the inputs; `HEALTH_GRACE_S`, `INSTANCE_WARMUP_S` and `terminate_timeout_s()` are derived from
  them and from the node's own settings (`node_setting()`: the stack's group vars, else the role
  default — the values the bundle ships to the node), never restated.
- The launching hook holds a node in Pending:Wait until its `/readyz` answers 200 (the node
  agent completes it), so neither the grace period nor the warm-up has to cover the bootstrap:
  AWS starts the grace period only after the launch hook completes ("If you use lifecycle hooks
  for instance launch, you can set the health check grace period to 0", Auto Scaling user
  guide, health-check-grace-period). The node agent records a heartbeat every
  `HEARTBEAT_INTERVAL_S` once its bootstrap venv exists, so the hook's heartbeat timeout covers
  the longest silence between two signs of life, not the bootstrap: `scaling.launch_timeout_s`,
  default `LAUNCH_TIMEOUT_DEFAULT_S` (derived below from the measured stages).
- `estimates()` sums the parts of each launch -> ready path. A part is measured (a range of
  seconds and where the figure comes from) or not measurable on a machine without a cloud and a
  GPU (seconds None); a path's total is a lower bound plus the named unmeasured parts, never a
  guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml
from torchfleet_compat import runtime_settings

from infra.bootstrap.torchfleet_agent import lifecycle as agent_lifecycle
from infra.matrix import REPO_ROOT

# -- the load balancer's view of a node (AWS target group; one place for the fleet to read) ----
LB_HEALTH_INTERVAL_S = 15
LB_HEALTH_TIMEOUT_S = 5
LB_HEALTHY_THRESHOLD = 2
LB_UNHEALTHY_THRESHOLD = 3
# The ALB stops sending new requests to a deregistering target at once and waits this long for
# requests in flight; the runtime's own drain (drain_timeout_s) runs after it.
DEREGISTRATION_DELAY_S = 30

# A node enters InService already answering /readyz 200 (the launch hook saw to it); the ALB
# needs LB_HEALTHY_THRESHOLD passing checks to call it healthy. One more interval of slack keeps
# a check that lands just before the threshold from counting against it.
HEALTH_GRACE_S = (LB_HEALTHY_THRESHOLD + 1) * LB_HEALTH_INTERVAL_S
# The node's load metrics mean something once the ALB routes to it (LB_HEALTHY_THRESHOLD checks)
# and one full metric period has been published (QueueDepth every 15 s, aggregated per minute).
METRIC_PERIOD_S = 60
INSTANCE_WARMUP_S = LB_HEALTHY_THRESHOLD * LB_HEALTH_INTERVAL_S + METRIC_PERIOD_S

# Target tracking's own alarms (AWS): scale out after 3 one-minute periods above target, scale
# in after 15 below. The Alibaba alarms copy these counts so both clouds react alike.
SCALE_OUT_PERIODS = 3
SCALE_IN_PERIODS = 15

# -- the launching hook's heartbeat timeout, from the measured bootstrap --------------------------
# The node agent (infra/bootstrap/torchfleet_agent/lifecycle.py, `heartbeats`) records a lifecycle
# heartbeat every HEARTBEAT_INTERVAL_S (120 s), starting one interval after its identity stage, on
# every boot of the bootstrap (a reboot for the driver stops and restarts it). The timeout must
# outlast the longest silence, which is the one around a reboot:
#   up to one interval since the last heartbeat before the reboot
#   + the reboot itself (EC2, not measurable in a container: docs/contracts/node.md budgets
#     1-2 min; the upper figure is taken)
#   + the stub (bootstrap venv, bundle) and the identity stage of the resumed boot (measured as
#     identity + the one venv the agent made before the stub existed, tests/bootstrap/, CPU
#     container, 2026-12-01: 15-31 s on a quiet machine, 204 s at most under load 8-12; the
#     worst is taken, although a resumed boot finds its venvs and bundle in place)
#   + one interval to the first heartbeat of that boot
#   = 120 + 120 + 204 + 120 = 564 s, rounded up to whole minutes: 600 s.
# The first boot's silence (launch -> first heartbeat: boot + identity/venv + one interval,
# 120 + 204 + 120 = 444 s) is shorter. A node whose agent fails reports ABANDON itself, so this
# timeout removes a node that died, or whose stub failed before the agent could run (no venv,
# no bundle, a bundle that does not verify: the state file names the stage). AWS ends
# any launch action after 48 h or 100 x this timeout (60000 s here), whatever the heartbeats.
HEARTBEAT_INTERVAL_S = agent_lifecycle.HEARTBEAT_S
EC2_REBOOT_MAX_S = 120
PRE_HEARTBEAT_STAGE_MAX_S = 204


def _launch_timeout_default() -> int:
    silence = (
        HEARTBEAT_INTERVAL_S + EC2_REBOOT_MAX_S + PRE_HEARTBEAT_STAGE_MAX_S + HEARTBEAT_INTERVAL_S
    )
    return math.ceil(silence / 60) * 60


LAUNCH_TIMEOUT_DEFAULT_S = _launch_timeout_default()

# How long `pulumi up` waits for a whole cold bootstrap: the group's first nodes passing their
# launch hook (wait_for_capacity_timeout), an Image Builder bake finishing. A budget, not a
# readiness figure, and not derivable here: the cold path's GPU parts are unmeasured
# (estimates()). A failing bootstrap says so at once (ABANDON / bake failed), so this bounds
# only how long a slow, healthy GPU cold start may hold `pulumi up`: one hour, AWS's own default
# lifecycle-hook timeout (and this stack's launch timeout before the measurements).
COLD_BOOTSTRAP_BUDGET_S = 3600

# The terminating hook (docs/contracts/node.md): the agent's watcher notices Terminating:Wait
# within one poll (IMDS every 5 s on AWS, the ESS API every 15 s: the slower is taken), runs
# `systemctl stop torchfleet-runtime`, which drains for at most drain_timeout_s and is killed
# by systemd SYSTEMD_STOP_MARGIN_S later (roles/inference_runtime/templates/
# torchfleet-runtime.service.j2, TimeoutStopSec), then completes CONTINUE with one API call,
# which the second margin covers.
SYSTEMD_STOP_MARGIN_S = 15
AGENT_MARGIN_S = max(agent_lifecycle.WATCH_POLL_S.values())


def node_setting(stack: str, variable: str) -> Any:
    """A role variable as the stack's nodes get it: inventories/<stack>/group_vars/*.yml (what
    the bundle ships), else the role's defaults/main.yml (the role is named by the prefix)."""
    for path in sorted((REPO_ROOT / "inventories" / stack / "group_vars").glob("*.yml")):
        values = yaml.safe_load(path.read_text()) or {}
        if variable in values:
            return values[variable]
    role = _role_of(variable)
    defaults = yaml.safe_load((REPO_ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    if variable not in (defaults or {}):
        raise KeyError(
            f"{variable} is neither in inventories/{stack}/group_vars nor in "
            f"roles/{role}/defaults/main.yml"
        )
    return defaults[variable]


def _role_of(variable: str) -> str:
    roles = sorted(
        (p.name for p in (REPO_ROOT / "roles").iterdir() if p.is_dir()), key=len, reverse=True
    )
    for role in roles:
        if variable.startswith(role + "_"):
            return role
    raise KeyError(f"{variable} belongs to no role under roles/")


def drain_timeout_s(stack: str) -> float:
    return float(node_setting(stack, "inference_runtime_drain_timeout_s"))


def latency_budget_s(stack: str) -> float:
    """The runtime's latency budget on this stack's nodes: the role's free-form runtime config,
    else the runtime's own default."""
    overrides = node_setting(stack, "inference_runtime_config") or {}
    if "latency_budget_ms" in overrides:
        return float(overrides["latency_budget_ms"]) / 1000
    return runtime_settings.defaults()["latency_budget_ms"] / 1000


def terminate_timeout_s(stack: str) -> int:
    """The terminating hook's timeout: the runtime's drain, systemd's stop margin, the agent's
    poll and its completion call. The ALB's deregistration delay is not added: AWS deregisters
    a terminating node from its load balancer and waits for the drain before the instance
    enters Terminating:Wait, where this timeout starts (Auto Scaling user guide, "How lifecycle
    hooks work"); the CLB listener here has no connection-drain delay to add."""
    return math.ceil(drain_timeout_s(stack) + SYSTEMD_STOP_MARGIN_S + AGENT_MARGIN_S)


def queue_depth_target(stack: str, requests_per_node_per_minute: float) -> float:
    """Little's law: at the request target, requests waiting = arrival rate x wait. Holding the
    wait at the runtime's latency budget makes the queue policy agree with the request policy
    at the target and act first when requests get slower (a bigger model, a smaller GPU)."""
    return round(requests_per_node_per_minute / 60 * latency_budget_s(stack), 2)


# -- launch -> ready, per path -------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    name: str
    seconds: tuple[float, float] | None  # measured (fastest, slowest); None: not measured here
    source: str


# tests/bootstrap/test_node_bootstrap.py, 2026-12-01: a Debian 12 systemd container with
# cloud-init and a NoCloud seed, moto for S3 / Auto Scaling, CPU-only nodes, torch from a local
# wheelhouse, load average <= 1.8 on 2 cores. Wall time from the container's boot.
MEASURED: dict[str, tuple[tuple[float, float], str]] = {
    "container_cold": (
        (98, 102),
        "bare Debian 12 node boot -> /readyz 200 + CONTINUE: identity + "
        "bootstrap venv 15-19 s, bundle fetch 0.2 s (with verify + "
        "unpack < 1 s), site.yml 74-76 s (CPU torch from a local "
        "wheelhouse), warm-up",
    ),
    "container_cold_debian11": (
        (110, 110),
        "the same on Debian 11 (Python 3.9, ansible-core 2.15, legacy torch 1.12.1): site.yml 80 s",
    ),
    "container_baked": (
        (36, 41),
        "baked image boot -> playbooks/baked.yml done (pin check, model "
        "fetch, warm-up); 63-66 s when the play asks for a reboot",
    ),
}
UNMEASURED = {
    "launch": "instance requested -> cloud-init starts (the cloud's provisioning and VM boot)",
    "start": "stopped warm-pool instance started -> systemd up (EC2 start)",
    "gpu_driver": "NVIDIA driver DKMS build + the one reboot it needs",
    "cuda_toolkit": "CUDA toolkit install (the cuda role)",
    "torch_cuda_download": "the CUDA torch wheel download (the test installs CPU torch from a "
    "local wheelhouse)",
    "gpu_warmup": "CUDA context + warm-up on the GPU instead of the CPU figure",
}


def _part(key: str) -> Part:
    if key in MEASURED:
        seconds, source = MEASURED[key]
        return Part(key, seconds, source)
    return Part(key, None, UNMEASURED[key])


def _lb_part() -> Part:
    healthy = float(LB_HEALTHY_THRESHOLD * LB_HEALTH_INTERVAL_S)
    return Part(
        "lb_healthy",
        (healthy, healthy),
        f"{LB_HEALTHY_THRESHOLD} passing checks x {LB_HEALTH_INTERVAL_S} s (target group)",
    )


_GPU_COLD = ("gpu_driver", "cuda_toolkit", "torch_cuda_download", "gpu_warmup")
PATHS = {
    "cold": ("launch", "container_cold", *_GPU_COLD),
    "cold_debian11": ("launch", "container_cold_debian11", *_GPU_COLD),
    "baked": ("launch", "container_baked", "gpu_warmup"),
    # a warmed node's next boot runs baked.yml and completes its launch action again
    "warm_pool": ("start", "container_baked", "gpu_warmup"),
}


@dataclass(frozen=True)
class Estimate:
    path: str
    parts: tuple[Part, ...]

    @property
    def known_s(self) -> tuple[float, float]:
        measured = [p.seconds for p in self.parts if p.seconds is not None]
        return sum(lo for lo, _ in measured), sum(hi for _, hi in measured)

    @property
    def unmeasured(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts if p.seconds is None)

    def summary(self) -> str:
        lo, hi = self.known_s
        text = f">= {lo:.0f}-{hi:.0f} s measured" if lo != hi else f">= {lo:.0f} s measured"
        if self.unmeasured:
            text += " + cloud/GPU only: " + ", ".join(self.unmeasured)
        return text


def estimates() -> dict[str, Estimate]:
    return {
        path: Estimate(path, tuple(_part(k) for k in keys) + (_lb_part(),))
        for path, keys in PATHS.items()
    }
