"""What a stack is: the stacks this repository ships (one Pulumi.<stack>.yaml each) and the
reading of a stack file's config for a run without the Pulumi CLI (the offline plan, `up`'s
preflight, the node bundle). A definition: the Pulumi program, the offline plan and the
operator's command all import it, and it imports none of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from infra import edge
from infra.config import ConfigError
from infra.matrix import REPO_ROOT

STACKS = ("aws-dev", "aws-prod", "alicloud-dev", "alicloud-prod")
KUBERNETES_STACKS = ("aws-k8s", "alicloud-k8s")  # mode: kubernetes (EKS, ACK)
ALL_STACKS = STACKS + KUBERNETES_STACKS


def load_stack_config(stack: str, path: Path | None = None) -> dict[str, Any]:
    path = path or REPO_ROOT / f"Pulumi.{stack}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no stack file {path} (stacks: {', '.join(ALL_STACKS)})")
    data = yaml.safe_load(path.read_text()) or {}
    values = data.get("config") or {}
    for key, value in values.items():
        name = key.split(":", 1)[-1]
        if isinstance(value, dict) and set(value) == {"secure"} and name in edge.SECRET_KEYS:
            values[key] = edge.offline_placeholder(name)
        elif isinstance(value, dict) and set(value) == {"secure"}:
            raise ConfigError(
                [
                    f"{key} is a Pulumi secret: the offline plan cannot decrypt it; "
                    "set a plain value in a copy of the stack file"
                ]
            )
    return values
