#!/usr/bin/env python3
"""moto in server mode for the bootstrap test, with the Auto Scaling calls moto 5.2.5 does not
implement: CompleteLifecycleAction and RecordLifecycleActionHeartbeat.

    python3 moto_server.py HOST PORT STATE_DIR

They behave as AWS documents them: the group must exist, the hook must be one of its hooks,
the instance one of its instances, the result CONTINUE or ABANDON, else a ValidationError. A
launch CONTINUE puts the instance in service; ABANDON (or a terminating hook's completion)
terminates it, and the group replaces it. Every call is appended to STATE_DIR/lifecycle.jsonl,
which is how the test sees what the node told the group. Everything else is moto's own."""

import json
import sys
import threading
from pathlib import Path

from moto.autoscaling.exceptions import ValidationError
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import EmptyResult
from moto.server import main

HOST, PORT, STATE = sys.argv[1], sys.argv[2], Path(sys.argv[3])
LOCK = threading.Lock()


def _lifecycle(self: AutoScalingResponse, call: str) -> EmptyResult:
    backend = self.autoscaling_backend
    group, hook = self._get_param("AutoScalingGroupName"), self._get_param("LifecycleHookName")
    instance, result = self._get_param("InstanceId"), self._get_param("LifecycleActionResult")
    hooks = backend.describe_lifecycle_hooks(group, [hook])
    member = [
        s
        for s in backend.describe_auto_scaling_instances([instance])
        if s.auto_scaling_group_name == group
    ]
    entry = {"call": call, "group": group, "hook": hook, "instance": instance, "result": result}
    with LOCK, (STATE / "lifecycle.jsonl").open("a") as log:
        log.write(json.dumps({**entry, "accepted": bool(hooks and member)}) + "\n")
    if not hooks or not member:
        raise ValidationError(f"No active Lifecycle Action found with instance ID {instance}")
    if call == "CompleteLifecycleAction":
        if result not in ("CONTINUE", "ABANDON"):
            raise ValidationError(f"LifecycleActionResult {result!r}: allowed CONTINUE, ABANDON")
        if (
            result == "ABANDON"
            or hooks[0].lifecycle_transition == "autoscaling:EC2_INSTANCE_TERMINATING"
        ):
            backend.terminate_instance(instance, should_decrement=False)
        else:
            member[0].lifecycle_state = "InService"
    return EmptyResult()


AutoScalingResponse.complete_lifecycle_action = lambda self: _lifecycle(
    self, "CompleteLifecycleAction"
)
AutoScalingResponse.record_lifecycle_action_heartbeat = lambda self: _lifecycle(
    self, "RecordLifecycleActionHeartbeat"
)

main(["-H", HOST, "-p", PORT])
