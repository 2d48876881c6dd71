"""What the agent asks of a cloud, and the one for this node (each behind its own SDKs, which
only that cloud's bootstrap venv has: the module is imported when chosen)."""

from __future__ import annotations

from typing import Dict, Protocol, Tuple, TypedDict

from .boot import NodeConfig
from .leave import Balancer


class Identity(TypedDict):
    """This node as its metadata service and its group see it."""

    instance_id: str
    region: str
    instance_type: str | None
    spot: bool | None  # None: unknown (an Alibaba node outside a group)
    target: str | None  # the group's target lifecycle state; None outside a group


# metric name -> (value, unit); units as CloudWatch names them
Metrics = Dict[str, Tuple[float, str]]


class Cloud(Protocol):
    def identity(self) -> Identity: ...

    def target_state(self) -> str | None: ...

    def lifecycle(self, hook: str, result: str, instance_id: str) -> None: ...

    def heartbeat(self, hook: str, instance_id: str) -> None: ...

    def put_metrics(self, values: Metrics) -> None: ...

    def spot_notice(self) -> str | None: ...

    def balancer(self, instance_id: str) -> Balancer | None: ...

    def secret_string(self, name: str) -> str: ...


def cloud_of(cfg: NodeConfig) -> Cloud:
    if cfg["cloud"] == "aws":
        from .aws import Aws

        return Aws(cfg)
    from .alicloud import Alicloud

    return Alicloud(cfg)
