#!/usr/bin/env python3
"""Record the engine events and outputs of a `pulumi up` of aws-dev, for the provision-stage
tests: `python tests/deploy/record_engine_events.py` rewrites tests/deploy/fixtures/.

The resources, their order, URNs, types, inputs and the stack outputs are those of the aws-dev
program under Pulumi's mock engine (infra.offline, clock pinned to TORCHFLEET_NOW); each becomes
the event pair the engine streams to the Automation API for a create (resourcePreEvent, then
resOutputsEvent), in the engine's JSON form that `pulumi.automation.EngineEvent.from_json`
parses, between a preludeEvent and a summaryEvent. The failed variant stops at the instance
with the diagnostic and resOpFailedEvent the AWS provider sends when EC2 has no capacity."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TORCHFLEET_NOW", "2026-03-02T10:17:00Z")  # tests/infra/conftest.py's pin

from infra.offline import run_offline  # noqa: E402
from infra.plan import load_stack_config  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
STACK = "aws-dev"
T0 = 1772446620  # TORCHFLEET_NOW as a Unix time
CAPACITY_ERROR = (
    "creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: "
    "500, RequestID: 3b0c6f3e-8c1e-4f7a-9d51-0d8e2a7c6b10, api error InsufficientInstanceCapacity: "
    "We currently do not have sufficient g6.xlarge capacity in the Availability Zone you requested "
    "(eu-central-1a). Our system will be working on provisioning additional capacity."
)


def _state(r, outputs=None):
    return {
        "type": r.type,
        "urn": r.urn,
        "id": "" if outputs is None else f"{r.name}-id",
        "parent": r.parent,
        "provider": "",
        "custom": r.custom,
        "delete": False,
        "protect": False,
        "inputs": r.inputs,
        "outputs": outputs or {},
    }


def _asset(value: object) -> dict:
    """An asset input (the node bundle's file) as the engine shows it: its path, here relative."""
    path = Path(str(getattr(value, "path", value)))
    return {"path": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)}


def record(fail_at: str | None = None) -> tuple[list[dict], dict, frozenset[str]]:
    run = run_offline(STACK, load_stack_config(STACK))
    events: list[dict] = [
        {
            "sequence": 0,
            "timestamp": T0,
            "preludeEvent": {
                "config": {
                    k: (v if isinstance(v, str) else json.dumps(v))
                    for k, v in load_stack_config(STACK).items()
                }
            },
        }
    ]
    created = 0

    def add(kind: str, body: dict) -> None:
        events.append({"sequence": len(events), "timestamp": T0 + len(events), kind: body})

    for r in run.resources:
        meta = {"op": "create", "urn": r.urn, "type": r.type, "provider": "", "new": _state(r)}
        add("resourcePreEvent", {"metadata": meta})
        if fail_at and r.type == fail_at:
            add(
                "diagnosticEvent",
                {
                    "urn": r.urn,
                    "prefix": "error: ",
                    "message": CAPACITY_ERROR + "\n",
                    "color": "never",
                    "severity": "error",
                },
            )
            add("resOpFailedEvent", {"metadata": meta, "status": 1, "steps": 1})
            add(
                "diagnosticEvent",
                {
                    "prefix": "error: ",
                    "message": "update failed\n",
                    "color": "never",
                    "severity": "error",
                },
            )
            break
        if r.type != "pulumi:pulumi:Stack":
            add("resOutputsEvent", {"metadata": {**meta, "new": _state(r, r.inputs)}})
            created += 1
    else:
        stack = next(r for r in run.resources if r.type == "pulumi:pulumi:Stack")
        add(
            "resOutputsEvent",
            {
                "metadata": {
                    "op": "create",
                    "urn": stack.urn,
                    "type": stack.type,
                    "provider": "",
                    "new": _state(stack, run.outputs),
                }
            },
        )
        created += 1
    add(
        "summaryEvent",
        {
            "maybeCorrupt": False,
            "durationSeconds": 94,
            "resourceChanges": {"create": created},
            "PolicyPacks": {},
        },
    )
    return events, run.outputs, run.secret_outputs


def main() -> int:
    FIXTURES.mkdir(exist_ok=True)
    events, outputs, secret = record()
    (FIXTURES / f"{STACK}.up.events.json").write_text(
        json.dumps(events, indent=1, default=_asset) + "\n"
    )
    (FIXTURES / f"{STACK}.up.outputs.json").write_text(
        json.dumps({k: {"value": v, "secret": k in secret} for k, v in outputs.items()}, indent=1)
        + "\n"
    )
    failed, _, _ = record(fail_at="aws:ec2/instance:Instance")
    (FIXTURES / f"{STACK}.up-failed.events.json").write_text(
        json.dumps(failed, indent=1, default=_asset) + "\n"
    )
    print(f"wrote {len(events)} + {len(failed)} events and {len(outputs)} outputs to {FIXTURES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
