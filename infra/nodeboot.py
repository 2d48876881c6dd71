"""What a node the cloud starts is handed: the bundle (built once per stack and run) and the
user-data that fetches, verifies and runs it (fleet-node's `infra.bundle` and
`infra.bootstrap`, called here and nowhere else in infra/).

Contract: `stack_bundle(cfg)` builds the bundle of the program's validated config once per
process (the program runs once; the offline plan and the tests run many stacks);
`user_data(...)` renders the one cloud-init
template for a BootstrapSpec whose bucket name may still be an Output and returns it base64
encoded, the form every launch spec here takes (AWS launch templates require it; the Alibaba
provider passes base64 through unchanged). The group and hook names are fixed so user-data can
name them before the group exists.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, cast

import pulumi

from infra import edge

# What the node agent publishes per node (its metrics module names them once).
from infra.bootstrap.torchfleet_agent.metrics import GPU_METRIC, QUEUE_METRIC, REQUEST_METRIC
from infra.config import StackConfig
from infra.constants import PROJECT

__all__ = ["GPU_METRIC", "QUEUE_METRIC", "REQUEST_METRIC"]

LAUNCH_HOOK = "torchfleet-launch"
TERMINATE_HOOK = "torchfleet-terminate"
METRICS_NAMESPACE = PROJECT
NONCURRENT_DAYS = 30  # old bundle versions stay in the bucket this long (rollback), then expire


def group_name(cfg: StackConfig) -> str:
    return f"{cfg.name}-asg" if cfg.cloud == "aws" else f"{cfg.name}-ess"


def fallback_group_name(cfg: StackConfig) -> str:
    """AWS: the on-demand group that fills in while spot cannot be had (infra.aws.fallback)."""
    return f"{cfg.name}-od-asg"


def candidate_group_name(cfg: StackConfig) -> str:
    """Group mode: the rollout's candidate group, its nodes on the `rollout` block's
    candidate_model: AWS's in the candidate target group only (infra.aws.fleet), Alibaba's in
    the CLB's VServer group beside the stable group at its own weight (infra.alicloud.fleet)."""
    return f"{cfg.name}-candidate-asg" if cfg.cloud == "aws" else f"{cfg.name}-candidate-ess"


# The rollout's candidate nodes carry this tag beside the node tags (per-version inventories).
CANDIDATE_TAG = ("torchfleet-track", "candidate")


# Where `torchfleet rollout` places a group stack's checked model copies in model_bucket
# (infra/rollout/tracks.py) and where the nodes the block names download them from.
MODEL_PREFIX = "models/"


def model_override(cfg: StackConfig, name: str) -> dict[str, str] | None:
    """The node config's `model` for the `rollout` block's file `name` (a content-addressed
    `<sha256>.pt` in model_bucket): the source and checksum the node agent hands Ansible as
    extra vars (inference_runtime_model_source / _checksum), which win over the bundle's group
    vars. None for another name (the block's defaults): the nodes serve the bundle's model."""
    from infra.config import model_digest

    digest = model_digest(name)
    if digest is None or not cfg.model_bucket:
        return None
    return {
        "source": bundle_url(cfg, cfg.model_bucket, MODEL_PREFIX + name),
        "checksum": f"sha256:{digest}",
    }


def track_models(cfg: StackConfig) -> dict[str, dict[str, str] | None]:
    """Group mode with a `rollout` block: each track's model override (model_override), the
    candidate's only while candidate_weight is above 0 (below, the candidate group does not
    exist, like the kubernetes candidate Deployment's 0 replicas). {} otherwise."""
    split = cfg.rollout
    if split is None or cfg.mode != "group":
        return {}
    return {
        "candidate": model_override(cfg, split.candidate_model) if split.candidate_weight else None,
        "stable": model_override(cfg, split.stable_model),
    }


_BUNDLES: dict[tuple[str, str], Any] = {}


def stack_bundle(cfg: StackConfig) -> Any:
    """infra.bundle.build(stack, config=cfg): the program's validated config goes in, so the
    bundle's node.json carries the config Pulumi really runs and the stack file (which may hold
    Pulumi secrets) is not read a second time. Reproducible and content-cached on disk by
    infra.bundle; cached here per process and per stack facts as well, so one run never packs
    the same tree twice (the tests run one stack under several configs)."""
    from infra import bundle

    key = (cfg.stack, json.dumps(bundle.stack_facts(cfg.stack, cfg), sort_keys=True))
    if key not in _BUNDLES:
        _BUNDLES[key] = bundle.build(cfg.stack, config=cfg)
    return _BUNDLES[key]


def clear_bundle_cache() -> None:
    _BUNDLES.clear()


def bundle_url(cfg: StackConfig, bucket: str, key: str) -> str:
    return f"{'s3' if cfg.cloud == 'aws' else 'oss'}://{bucket}/{key}"


def user_data(
    cfg: StackConfig,
    bucket: pulumi.Input[str],
    *,
    mode: str,
    group: bool,
    extra: Mapping[str, pulumi.Input[Any]] | None = None,
    group_name_of_node: str | None = None,
) -> pulumi.Output[str]:
    """Base64 of the rendered #cloud-config for this stack's nodes. `extra` holds further
    BootstrapSpec fields, Outputs allowed (Alibaba's group and metric group ids);
    `group_name_of_node` names another group than the stack's own (AWS's on-demand fallback)."""
    from infra.bootstrap import BootstrapSpec, render_user_data

    bundle = stack_bundle(cfg)
    names = list((extra or {}).keys())

    def render(values: list[Any]) -> str:
        spec: BootstrapSpec = BootstrapSpec(
            cloud=cfg.cloud,
            region=cfg.region,
            stack=cfg.stack,
            bundle_bucket=values[0],
            bundle_key=bundle.key,
            bundle_sha256=bundle.sha256,
            mode=mode,
            group_name=(group_name_of_node or group_name(cfg)) if group else None,
            launch_hook=LAUNCH_HOOK if group else None,
            terminate_hook=TERMINATE_HOOK if group else None,
            service_port=cfg.service_port,
            metrics_namespace=METRICS_NAMESPACE,
            api_token_secret=edge.secret_name(cfg),
        )
        # the further fields are checked by name where they are rendered (render_user_data)
        spec.update(cast(BootstrapSpec, dict(zip(names, values[1:], strict=True))))
        return base64.b64encode(render_user_data(spec).encode()).decode()

    return pulumi.Output.all(bucket, *[(extra or {})[n] for n in names]).apply(render)
