"""The smoke stage: one real prediction through the stack's endpoint.

The body is built from what the node itself says it serves (GET /v1/model: input shape and
dtype) by infra.client, so the check needs no knowledge of the model.
Instances mode: the endpoint is a node's private address; the request goes through the SSH
tunnel of the node that owns that address. Group mode (and the demo's local load balancer):
straight to the load balancer, which answers 503 until its own health checks have seen a node
ready after the controller has: that answer is waited out, at most BALANCER_WAIT_S."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from infra import client
from infra.deploy.stage import StageError

BALANCER_WAIT_S = 30.0


@dataclass
class Prediction:
    endpoint: str
    via: str  # "direct" or "ssh tunnel through HOST"
    status: int | None
    seconds: float
    outputs: int
    output_size: int

    def describe(self) -> str:
        return (
            f"POST {self.endpoint.rstrip('/')}/v1/predict ({self.via}) -> {self.status} in "
            f"{self.seconds * 1000:.0f} ms: {self.outputs} output(s) of {self.output_size} "
            "value(s)"
        )


def _size(row: Any) -> int:
    if isinstance(row, list):
        return sum(_size(r) for r in row) if row and isinstance(row[0], list) else len(row)
    return 1


def predict(base: str, endpoint: str, via: str, auth: client.Auth | None = None) -> Prediction:
    """POST one instance to `base` (the endpoint itself, or a tunnel to it) with the stack's
    token, checking an https endpoint's certificate."""
    try:
        return _predict(base, endpoint, via, auth)
    except client.ClientError as err:
        raise StageError("smoke", str(err), fix="check the endpoint's certificate") from None


def _predict(base: str, endpoint: str, via: str, auth: client.Auth | None) -> Prediction:
    deadline = time.monotonic() + BALANCER_WAIT_S
    while True:
        code, body, _ = client.request("GET", base.rstrip("/") + "/v1/model", timeout=30, auth=auth)
        if code != 503 or via != "direct" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if code != 200:
        raise StageError(
            "smoke",
            f"GET {endpoint.rstrip('/')}/v1/model ({via}) answered {code or 'nothing'}",
            fix=_fix(via, code),
        )
    try:
        payload, headers = client.card_payload(json.loads(body), batch=1, binary=False)
    except client.ClientError as err:
        raise StageError(
            "smoke",
            f"{endpoint}: {err}",
            fix="give the model an input_shape and a dtype the client knows (model.json or the "
            "runtime config)",
        ) from None
    code, body, took = client.request(
        "POST", base.rstrip("/") + "/v1/predict", payload, headers, timeout=60, auth=auth
    )
    if code != 200:
        raise StageError(
            "smoke",
            f"POST {endpoint.rstrip('/')}/v1/predict ({via}) answered "
            f"{code or 'nothing'}: {body[:300].decode(errors='replace')}",
            fix=_fix(via, code),
        )
    outputs = json.loads(body).get("outputs") or []
    return Prediction(endpoint, via, code, took, len(outputs), _size(outputs[0]) if outputs else 0)


def _fix(via: str, code: int | None = None) -> str:
    if code == 401:
        return (
            "the endpoint refused the stack's API token (output api_token): a rotation in "
            "progress (torchfleet rotate-token) or a node that has not read its token yet"
        )
    if via == "direct":
        return (
            "an internal load balancer (no torchfleet:client_cidrs) answers only inside the "
            "VPC, and a public one only to client_cidrs: run from there, then re-run"
        )
    return "look at the runtime's log on the node (`journalctl -u torchfleet-runtime`), then re-run"
