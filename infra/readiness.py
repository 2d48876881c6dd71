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
  guide, health-check-grace-period). The hook's heartbeat timeout is what covers the bootstrap:
  `scaling.launch_timeout_s`, default `LAUNCH_TIMEOUT_DEFAULT_S`.
- `estimates()` sums the parts of each launch -> ready path. A part is measured (seconds and
  where the figure comes from) or not measurable on a machine without a cloud and a GPU
  (seconds None); a path's total is a lower bound plus the named unmeasured parts, never a
  guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

from infra.matrix import REPO_ROOT

# -- the load balancer's view of a node (AWS target group; one place for the fleet to read) ----
LB_HEALTH_PATH = "/readyz"  # 200 only once the model is warmed and the node is not draining
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

# PENDING(fleet-node): the launching hook's default heartbeat timeout. To be replaced by the
# measured cold bootstrap (tests/bootstrap/, container, no GPU) plus the GPU-only parts below,
# x 1.5. The node agent records a heartbeat at least every 10 minutes while it works, so this is
# the backstop for a node that died, not the budget of a slow one.
LAUNCH_TIMEOUT_DEFAULT_S = 3600

# systemd gives the runtime drain_timeout_s + 15 s before SIGKILL
# (roles/inference_runtime/templates/torchfleet-runtime.service.j2, TimeoutStopSec).
SYSTEMD_STOP_MARGIN_S = 15
# The agent notices the Terminating:Wait state within one metadata poll and completes the
# action with one API call; two polls of its 15 s loop cover both.
AGENT_MARGIN_S = 30


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
        raise KeyError(f"{variable} is neither in inventories/{stack}/group_vars nor in "
                       f"roles/{role}/defaults/main.yml")
    return defaults[variable]


def _role_of(variable: str) -> str:
    roles = sorted((p.name for p in (REPO_ROOT / "roles").iterdir() if p.is_dir()),
                   key=len, reverse=True)
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
    from torchfleet_runtime.config import Config

    return Config().latency_budget_ms / 1000


def terminate_timeout_s(stack: str) -> int:
    """The terminating hook's timeout: the ALB's deregistration, then the runtime's drain, then
    systemd's stop margin, then the agent's poll and completion call."""
    return math.ceil(DEREGISTRATION_DELAY_S + drain_timeout_s(stack) + SYSTEMD_STOP_MARGIN_S
                     + AGENT_MARGIN_S)


def queue_depth_target(stack: str, requests_per_node_per_minute: float) -> float:
    """Little's law: at the request target, requests waiting = arrival rate x wait. Holding the
    wait at the runtime's latency budget makes the queue policy agree with the request policy
    at the target and act first when requests get slower (a bigger model, a smaller GPU)."""
    return round(requests_per_node_per_minute / 60 * latency_budget_s(stack), 2)


# -- launch -> ready, per path -------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    name: str
    seconds: float | None  # None: not measured (yet, or not without a cloud account and a GPU)
    source: str
    measurable_here: bool = True


# PENDING(fleet-node): the container bootstrap test's figures (tests/bootstrap/, bare systemd
# container, NoCloud seed, moto S3). Each stays None until measured; never filled by estimate.
MEASURED: dict[str, tuple[float | None, str]] = {
    "bundle": (None, "fetch + sha256 verify + unpack, container bootstrap test (PENDING)"),
    "converge_cold": (None, "site.yml against localhost from a bare image, container bootstrap "
                            "test, CPU torch (PENDING)"),
    "converge_baked": (None, "baked mode: pin check + model fetch, container bootstrap test "
                             "(PENDING)"),
    "warmup": (None, "runtime start -> /readyz 200 (model load + warm-up), container bootstrap "
                     "test, CPU (PENDING)"),
}
UNMEASURED = {
    "launch": "instance requested -> cloud-init starts (the cloud's provisioning and OS boot)",
    "start": "stopped instance started -> systemd up (EC2 start from a warm pool)",
    "gpu_stack": "NVIDIA driver build + reboot, CUDA toolkit and CUDA torch wheels "
                 "(GPU-only steps the container skips by the no-device fact)",
    "gpu_warmup": "CUDA context + warm-up on the GPU instead of the CPU figure",
}


def _part(key: str) -> Part:
    if key in MEASURED:
        seconds, source = MEASURED[key]
        return Part(key, seconds, source)
    return Part(key, None, UNMEASURED[key], measurable_here=False)


def _lb_part() -> Part:
    return Part("lb_healthy", float(LB_HEALTHY_THRESHOLD * LB_HEALTH_INTERVAL_S),
                f"{LB_HEALTHY_THRESHOLD} passing checks x {LB_HEALTH_INTERVAL_S} s (target group)")


PATHS = {
    "cold": ("launch", "bundle", "converge_cold", "gpu_stack", "warmup", "gpu_warmup"),
    "baked": ("launch", "bundle", "converge_baked", "warmup", "gpu_warmup"),
    "warm_pool": ("start", "warmup", "gpu_warmup"),
}


@dataclass(frozen=True)
class Estimate:
    path: str
    parts: tuple[Part, ...]

    @property
    def known_s(self) -> float:
        return sum(p.seconds for p in self.parts if p.seconds is not None)

    def missing(self, measurable_here: bool) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts
                     if p.seconds is None and p.measurable_here is measurable_here)

    def summary(self) -> str:
        text = f">= {self.known_s:.0f} s known"
        if self.missing(True):
            text += " + pending measurement: " + ", ".join(self.missing(True))
        if self.missing(False):
            text += " + cloud/GPU only: " + ", ".join(self.missing(False))
        return text


def estimates() -> dict[str, Estimate]:
    return {path: Estimate(path, tuple(_part(k) for k in keys) + (_lb_part(),))
            for path, keys in PATHS.items()}

