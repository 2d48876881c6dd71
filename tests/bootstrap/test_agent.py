"""The node agent's parts that need no node: its pins, the Alibaba request signing (checked
against the vendors' published vectors), the metrics it publishes, and its Alibaba path end to
end against a fake ECS metadata service + ESS + CloudMonitor + OSS on loopback that checks every
signature with the fake account's secret (no Alibaba fake exists to run a node against; the
AWS path runs for real in test_node_bootstrap.py)."""

from __future__ import annotations

import datetime
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from nodekit import REPO

from infra.bootstrap import agent


def test_pins_cover_the_node_pythons_and_match_the_repo_lock() -> None:
    for version in [(3, 9), (3, 10), (3, 11), (3, 12), (3, 13)]:
        aws = agent.pins(version, "aws")
        assert any(p.startswith("ansible-core==") for p in aws) and any(
            p.startswith("boto3==") for p in aws
        )
        assert not any(p.startswith("boto3") for p in agent.pins(version, "alicloud"))
    assert "ansible-core==2.15.13" in agent.pins((3, 9), "aws")  # 2.17+ needs Python >= 3.10
    for version in [(3, 8), (3, 14)]:
        with pytest.raises(
            agent.Failure, match=r"cannot run the pinned ansible-core \(supported: 3\.9, "
        ):
            agent.pins(version, "aws")
    # On 3.11 the node runs the same ansible-core and boto3 as this repository's lock.
    lock = dict(
        line.lower().split("==")
        for line in (REPO / "requirements" / "constraints.txt").read_text().splitlines()
        if "==" in line
    )
    for pin in agent.pins((3, 11), "aws"):
        name, version = pin.lower().split("==")
        if name in lock:
            assert lock[name] == version, (
                f"{pin} differs from requirements/constraints.txt {lock[name]}"
            )


def test_rpc_signature_matches_the_documented_example() -> None:
    # Alibaba Cloud's RPC signature v1 example (ECS "Request signatures", secret testsecret).
    params = {
        "Timestamp": "2016-02-23T12:46:24Z",
        "Format": "XML",
        "AccessKeyId": "testid",
        "Action": "DescribeRegions",
        "SignatureMethod": "HMAC-SHA1",
        "SignatureNonce": "3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf",
        "Version": "2014-05-26",
        "SignatureVersion": "1.0",
    }
    assert agent.rpc_signature("testsecret", "GET", params) == "OLeaidS1JvxuMvnyHOwuJ+uX5qY="


def test_oss_v4_signature_matches_the_sdk_vector() -> None:
    # The header-signature vector of alibabacloud-oss-python-sdk-v2's signer tests.
    when = datetime.datetime.fromtimestamp(1702743657, datetime.UTC)
    headers = {
        "x-oss-head1": "value",
        "abc": "value",
        "ZAbc": "value",
        "XYZ": "value",
        "content-type": "text/plain",
        "x-oss-content-sha256": "UNSIGNED-PAYLOAD",
        "x-oss-date": when.strftime("%Y%m%dT%H%M%SZ"),
    }
    query = {
        "param1": "value1",
        "+param1": "value3",
        "|param1": "value4",
        "+param2": "",
        "|param2": "",
        "param2": "",
    }
    auth = agent.oss_v4_authorization(
        "ak", "sk", "cn-hangzhou", "PUT", "bucket", "1234+-/123/1.txt", query, headers, when
    )
    assert auth == (
        "OSS4-HMAC-SHA256 Credential=ak/20231216/cn-hangzhou/oss/aliyun_v4_request,"
        "Signature=e21d18daa82167720f9b1047ae7e7f1ce7cb77a31e8203a7d5f4624fa0284afe"
    )


METRICS = """# HELP torchfleet_queue_depth Instances waiting in the batch queue.
torchfleet_queue_depth 7.0
torchfleet_requests_total{code="200"} 90.0
torchfleet_requests_total{code="400"} 10.0
torchfleet_gpu_utilization_ratio{gpu="0"} 0.5
torchfleet_gpu_utilization_ratio{gpu="1"} 0.7
"""


def test_scrape_reads_queue_gpu_and_request_rate() -> None:
    values, sample = agent.scrape(METRICS, None, now_s=100.0)
    assert values["QueueDepth"] == (7.0, "Count")
    assert values["GpuUtilization"][0] == pytest.approx(60.0)
    assert "RequestRate" not in values and sample == {"t": 100.0, "requests": 100.0}
    later, _ = agent.scrape(METRICS.replace("90.0", "120.0"), sample, now_s=115.0)
    assert later["RequestRate"] == (pytest.approx(2.0), "Count/Second")
    restarted, _ = agent.scrape("torchfleet_queue_depth 0\n", sample, now_s=130.0)
    assert (
        "RequestRate" not in restarted and "GpuUtilization" not in restarted
    )  # no GPU, counter reset


SECRET, TOKEN = "node-secret", "sts-token"


class FakeAlibaba(BaseHTTPRequestHandler):
    """ECS metadata (hardened mode), ESS, CloudMonitor and OSS in one loopback server."""

    calls: list[dict[str, str]] = []
    lifecycle_state = "Pending:Wait"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: str | bytes) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        assert (
            self.path == "/latest/api/token"
            and self.headers["X-aliyun-ecs-metadata-token-ttl-seconds"]
        )
        self._send(200, "imds-token")

    def do_GET(self) -> None:
        if self.path.startswith("/latest/meta-data/"):
            if self.headers.get("X-aliyun-ecs-metadata-token") != "imds-token":
                return self._send(401, "token required")
            meta = {
                "instance-id": "i-node1",
                "region-id": "cn-shanghai",
                "instance/instance-type": "ecs.gn6i-c4g1.xlarge",
                "ram/security-credentials/": "torchfleet-node\n",
                "ram/security-credentials/torchfleet-node": json.dumps(
                    {
                        "AccessKeyId": "STS.node",
                        "AccessKeySecret": SECRET,
                        "SecurityToken": TOKEN,
                        "Expiration": "2099-01-01T00:00:00Z",
                        "Code": "Success",
                    }
                ),
            }
            key = self.path[len("/latest/meta-data/") :]
            return self._send(200, meta[key]) if key in meta else self._send(404, "")
        if self.path.startswith("/models/"):  # OSS
            auth = self.headers.get("Authorization", "")
            assert auth.startswith("OSS4-HMAC-SHA256 Credential=STS.node/"), auth
            assert self.headers["x-oss-security-token"] == TOKEN
            when = datetime.datetime.strptime(self.headers["x-oss-date"], "%Y%m%dT%H%M%SZ").replace(
                tzinfo=datetime.UTC
            )
            signed = {
                k.lower(): v for k, v in self.headers.items() if k.lower().startswith("x-oss-")
            }
            want = agent.oss_v4_authorization(
                "STS.node",
                SECRET,
                "cn-shanghai",
                "GET",
                "models-bucket",
                urllib.parse.unquote(self.path.lstrip("/")),
                {},
                signed,
                when,
            )
            return self._send(
                200 if auth == want else 403, b"model-bytes" if auth == want else b"bad signature"
            )
        params = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        signature = params.pop("Signature")
        if (
            signature != agent.rpc_signature(SECRET, "GET", params)
            or params.get("SecurityToken") != TOKEN
        ):
            return self._send(400, json.dumps({"Code": "SignatureDoesNotMatch"}))
        FakeAlibaba.calls.append(params)
        self._send(200, json.dumps(self.answer(params)))

    def answer(self, p: dict[str, str]) -> dict[str, Any]:
        action = p["Action"]
        if action == "DescribeScalingInstances":
            assert p["ScalingGroupId"] == "asg-1" and p["InstanceId.1"] == "i-node1"
            return {
                "ScalingInstances": {
                    "ScalingInstance": [
                        {
                            "InstanceId": "i-node1",
                            "LifecycleState": FakeAlibaba.lifecycle_state,
                            "ScalingActivityId": "asa-own",
                            "SpotStrategy": "SpotWithPriceLimit",
                        }
                    ]
                }
            }
        if action == "DescribeLifecycleHooks":
            return {
                "LifecycleHooks": {
                    "LifecycleHook": [{"LifecycleHookId": "ash-" + p["LifecycleHookName"]}]
                }
            }
        if action == "DescribeScalingActivities":
            return {"ScalingActivities": {"ScalingActivity": [{"ScalingActivityId": "asa-other"}]}}
        if action == "DescribeLifecycleActions":
            actions = {
                "asa-own": [
                    {
                        "LifecycleHookId": "ash-torchfleet-launch",
                        "LifecycleActionToken": "tok-launch",
                        "InstanceIds": {"InstanceId": ["i-node1", "i-node2"]},
                    }
                ],
                "asa-other": [
                    {
                        "LifecycleHookId": "ash-torchfleet-terminate",
                        "LifecycleActionToken": "tok-term",
                        "InstanceIds": {"InstanceId": ["i-node1"]},
                    }
                ],
            }
            return {
                "LifecycleActions": {"LifecycleAction": actions.get(p["ScalingActivityId"], [])}
            }
        return {"RequestId": "ok"}


@pytest.fixture
def alibaba() -> Iterator[str]:
    FakeAlibaba.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeAlibaba)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_alibaba_node_identity_lifecycle_metrics_and_oss(alibaba: str, tmp_path: Path) -> None:
    cfg = {
        "cloud": "alicloud",
        "region": "cn-shanghai",
        "group_name": "torchfleet-alicloud-prod-ess",
        "group_id": "asg-1",
        "metrics_group_id": "4242",
        "launch_hook": "torchfleet-launch",
        "terminate_hook": "torchfleet-terminate",
        "endpoints": {k: alibaba for k in ("imds", "ess", "cms", "oss")},
    }
    cloud = agent.cloud_of(cfg)
    ident = cloud.identity()
    assert ident == {
        "instance_id": "i-node1",
        "region": "cn-shanghai",
        "instance_type": "ecs.gn6i-c4g1.xlarge",
        "spot": True,
        "target": "InService",
    }

    cloud.lifecycle("torchfleet-launch", "CONTINUE", "i-node1")  # its own activity's action
    cloud.lifecycle(
        "torchfleet-terminate", "CONTINUE", "i-node1"
    )  # found in the group's activities
    done = [c for c in FakeAlibaba.calls if c["Action"] == "CompleteLifecycleAction"]
    assert [
        (c["LifecycleHookId"], c["LifecycleActionToken"], c["LifecycleActionResult"]) for c in done
    ] == [
        ("ash-torchfleet-launch", "tok-launch", "CONTINUE"),
        ("ash-torchfleet-terminate", "tok-term", "CONTINUE"),
    ]
    assert all(c["Version"] == "2014-08-28" and c["RegionId"] == "cn-shanghai" for c in done)
    assert not [c for c in FakeAlibaba.calls if c["Action"] == "DescribeScalingGroups"], (
        "group_id given"
    )

    FakeAlibaba.lifecycle_state = "Removing:Wait"
    try:
        assert cloud.target_state() == "Terminated"
    finally:
        FakeAlibaba.lifecycle_state = "Pending:Wait"

    values, _ = agent.scrape(METRICS, {"t": 0.0, "requests": 70.0}, now_s=15.0)
    cloud.put_metrics(values)
    put = [c for c in FakeAlibaba.calls if c["Action"] == "PutCustomMetric"][0]
    assert put["Version"] == "2019-01-01"
    metrics = {
        put[f"MetricList.{i}.MetricName"]: json.loads(put[f"MetricList.{i}.Values"])["value"]
        for i in (1, 2, 3)
    }
    assert metrics == {"GpuUtilization": pytest.approx(60.0), "QueueDepth": 7.0, "RequestRate": 2.0}
    assert all(
        json.loads(put[f"MetricList.{i}.Dimensions"]) == {"scaling_group": "asg-1"}
        and put[f"MetricList.{i}.GroupId"] == "4242"
        for i in (1, 2, 3)
    )

    dest = tmp_path / "model.pt"
    cloud.fetch("models-bucket", "models/model.pt", str(dest))
    assert dest.read_bytes() == b"model-bytes"  # 403 unless the V4 signature verifies
