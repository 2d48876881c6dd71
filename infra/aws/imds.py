"""The instance metadata rule of every AWS instance a stack starts (the GPU nodes' and EKS
nodes' launch templates, the monitoring host, the image bake's build instance): IMDSv2 only (a
session token required) and one network hop, so a container on the host cannot reach the
credentials. Each resource's argument type differs; this is the one place the rule is written.
The endpoint stays on where a type has the switch (`ENABLED`): the node agent reads it."""

from __future__ import annotations

from typing import TypedDict


class Imdsv2(TypedDict):
    http_tokens: str
    http_put_response_hop_limit: int


class Enabled(Imdsv2):
    http_endpoint: str


IMDSV2 = Imdsv2(http_tokens="required", http_put_response_hop_limit=1)
ENABLED = Enabled(http_endpoint="enabled", **IMDSV2)
