"""The node agent's Alibaba calls on a node's own Python, in the bootstrap venv the stub makes
from boot.SDK_PINS: identity, a lifecycle action, a heartbeat, metrics and an OSS download
through the official SDKs against fake_alibaba.py, in one process. Run by
test_alibaba_node_sdks.py inside the node image (the agent package and this directory on
PYTHONPATH); prints "ok" and exits 0 when every call went through and verified."""

from __future__ import annotations

import sys
import tempfile
from typing import Any

from fake_alibaba import FakeAlibaba, role_credentials
from torchfleet_agent import boot
from torchfleet_agent.cloud import cloud_of


def ess(action: str, params: dict[str, str]) -> dict[str, Any]:
    if action == "DescribeScalingInstances":
        return {
            "ScalingInstances": [
                {"InstanceId": "i-1", "LifecycleState": "Pending:Wait", "ScalingActivityId": "a-1"}
            ]
        }
    if action == "DescribeLifecycleHooks":
        return {"LifecycleHooks": [{"LifecycleHookId": "ash-1"}]}
    if action == "DescribeScalingActivities":
        return {"ScalingActivities": []}
    if action == "DescribeLifecycleActions":
        action_ = {"LifecycleHookId": "ash-1", "LifecycleActionToken": "t", "InstanceIds": ["i-1"]}
        return {"LifecycleActions": [action_]}
    return {}


def main() -> int:
    metadata = {
        "instance-id": "i-1",
        "instance/instance-type": "ecs.gn7i-c8g1.2xlarge",
        "ram/security-credentials/": "node",
        "ram/security-credentials/node": role_credentials(),
    }
    with FakeAlibaba(ess, metadata) as fake, tempfile.TemporaryDirectory() as tmp:
        cfg: Any = {
            "cloud": "alicloud",
            "region": "cn-shanghai",
            "group_name": "g",
            "group_id": "asg-1",
            "endpoints": {k: fake.url for k in ("imds", "ess", "cms", "oss")},
        }
        cloud = cloud_of(cfg)
        ident = cloud.identity()
        cloud.heartbeat("launch", ident["instance_id"])
        cloud.lifecycle("launch", "CONTINUE", ident["instance_id"])
        cloud.put_metrics({"QueueDepth": (3.0, "Count")})
        fake.objects["bundles", "k"] = b"bundle-bytes"
        boot.fetch_object(cfg, "bundles", "k", tmp + "/f")
        with open(tmp + "/f", "rb") as f:
            fetched = f.read()
    want = ["RecordLifecycleActionHeartbeat", "CompleteLifecycleAction", "PutCustomMetric"]
    done = [a for a in fake.actions() if a in want]
    if fake.refused or done != want or fetched != b"bundle-bytes" or ident["target"] != "InService":
        print(f"FAILED: refused {fake.refused}, calls {fake.actions()}, identity {ident}")
        return 1
    print(f"ok: Python {sys.version.split()[0]}, calls {fake.actions()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
