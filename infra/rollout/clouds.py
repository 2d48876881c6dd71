"""One rollout table per cloud: what `torchfleet rollout` does differently on AWS and on
Alibaba, declared once and looked up once (command.py's `rollout_of(cfg)`).

Contract. `CLOUDS[cloud]` is a `CloudRollout`:
- `figures`: the TrackMetricsSource that reads each track's figures where no Prometheus is given
  (mode: group): AWS, the ALB's per target group in CloudWatch; Alibaba, the nodes' own in
  CloudMonitor by scaling group (signals.py);
- `balancer_figures`: where the load balancer's own figures are, per listener: why a
  mode: kubernetes stack needs --prometheus (`needs_prometheus`);
- `refresh(cfg, say)`: how a promotion reaches the running stable nodes of a group stack
  (refresh.py: AWS's instance refresh of the stable groups, Alibaba's surge-first roll);
- `group_limit(cfg)`: the most candidate share a group stack's split reaches: AWS's listener
  weights give any, 100 % included (the promotion's step); Alibaba's VServer group what its
  weights can beside the stable group's minimum (RolloutSplit.max_backend_share), the rest stays
  on the stable nodes until the promotion rolls them;
- `targeted_step`: a group-mode weight step is a targeted `pulumi up` of what the split changes
  (infra/deploy/split.py) rather than the whole `up` pipeline; `step_note` says what the cloud
  does with such a step.
`limit(cfg)` is the split's cap by mode (kubernetes: KUBERNETES_LIMIT, group: group_limit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from infra.aws import fallback
from infra.config import RolloutSplit, StackConfig
from infra.k8s.addons import ADDON_NAMESPACE
from infra.nodeboot import group_name
from infra.rollout.errors import RolloutError
from infra.rollout.refresh import AsgRefresh, EssRoll, Refresh
from infra.rollout.signals import CloudMonitorSource, CloudWatchSource, TrackMetricsSource

# The candidate Deployment's share stops below 100: a promotion is the stable Deployment on the
# candidate's file (config.py refuses candidate_weight 100 in mode: kubernetes).
KUBERNETES_LIMIT = 99


@dataclass(frozen=True)
class CloudRollout:
    cloud: str
    figures: type[TrackMetricsSource]
    balancer_figures: str
    refresh: Callable[[StackConfig, Callable[[str], None]], Refresh]
    group_limit: Callable[[StackConfig], int]
    targeted_step: bool
    step_note: str

    def limit(self, cfg: StackConfig) -> int:
        return KUBERNETES_LIMIT if cfg.mode == "kubernetes" else self.group_limit(cfg)

    def needs_prometheus(self, cfg: StackConfig) -> str | None:
        """Why a stack without per-track figures of its cloud (mode: kubernetes) needs
        --prometheus, and where its Prometheus is; None for a group stack."""
        if cfg.mode == "group":
            return None
        return (
            f"--prometheus URL is required on a mode: {cfg.mode} stack on {cfg.cloud}: the guards "
            f"compare figures per model version, {self.balancer_figures} are per listener, the "
            "same for both Deployments, and the pods run no node agent to publish their own "
            "(mode: group stacks have those). The cluster's Prometheus: `kubectl -n "
            f"{ADDON_NAMESPACE} port-forward svc/prometheus-server 9090:80`, then --prometheus "
            "http://127.0.0.1:9090"
        )


CLOUDS = {
    "aws": CloudRollout(
        cloud="aws",
        figures=CloudWatchSource,
        balancer_figures="the NLB's in CloudWatch",
        refresh=lambda cfg, say: AsgRefresh(fallback.stable_groups(cfg), cfg.region, say),
        group_limit=lambda cfg: 100,
        targeted_step=True,
        step_note="the listener's weighted forward (and the candidate group's size) alone",
    ),
    "alicloud": CloudRollout(
        cloud="alicloud",
        figures=CloudMonitorSource,
        balancer_figures="the CLB's figures in CloudMonitor",
        refresh=lambda cfg, say: EssRoll(group_name(cfg), cfg.region, say),
        group_limit=lambda cfg: RolloutSplit.max_backend_share(cfg.nodes.min, cfg.nodes.max),
        targeted_step=True,
        step_note=(
            "the candidate group's size and its VServer group weight alone; ESS applies a new "
            "weight by detaching and re-attaching the candidate group, so its nodes leave the "
            "CLB for a moment (the stable nodes never move)"
        ),
    ),
}


def rollout_of(cfg: StackConfig) -> CloudRollout:
    """The stack's cloud's table; RolloutError for a cloud without one."""
    try:
        return CLOUDS[cfg.cloud]
    except KeyError:
        raise RolloutError(
            f"no rollout table for cloud {cfg.cloud!r}; built: {', '.join(CLOUDS)}"
        ) from None
