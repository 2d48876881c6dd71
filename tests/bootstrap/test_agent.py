"""The node agent's parts that need no node: its pins, the metrics it publishes, the stub's bundle
handling, and its Alibaba path end to end through Alibaba's official SDKs against a fake ECS
metadata service + ESS + CloudMonitor + OSS on loopback (fake_alibaba.py) that recomputes every
signature with the SDKs' own signers (no Alibaba fake exists to run a node against; the AWS path
runs for real in test_node_bootstrap.py)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_alibaba import FakeAlibaba, role_credentials
from nodekit import REPO, sdk_pins_for
from packaging.requirements import Requirement

from infra.bootstrap.torchfleet_agent import boot, metrics, playbook
from infra.bootstrap.torchfleet_agent.cloud import cloud_of

NODE_PYTHONS = ["3.8.10", "3.9.2", "3.10.12", "3.11.2", "3.12.3", "3.13.5"]


def selected(cloud: str, python: str) -> dict[str, str]:
    """The bootstrap venv's pins that pip installs on CPython `python` (name -> version)."""
    chosen: dict[str, str] = {}
    for pin in sdk_pins_for(cloud, python):
        name, version = pin.split("==")
        assert name not in chosen, f"{name} pinned twice for Python {python}"
        chosen[name] = version
    return chosen


def lock() -> dict[str, str]:
    return dict(
        line.lower().replace("_", "-").split("==")
        for line in (REPO / "requirements" / "constraints.txt").read_text().splitlines()
        if "==" in line
    )


def test_ansible_pins_cover_the_controller_pythons() -> None:
    for version in [(3, 9), (3, 10), (3, 11), (3, 12), (3, 13)]:
        assert any(p.startswith("ansible-core==") for p in playbook.pins(version))
    assert "ansible-core==2.15.13" in playbook.pins((3, 9))  # 2.17+ needs Python >= 3.10
    for version in [(3, 8), (3, 14)]:
        with pytest.raises(
            boot.Failure, match=r"cannot run the pinned ansible-core \(supported: 3\.9, "
        ):
            playbook.pins(version)
    # On 3.11 the node runs the same ansible-core as this repository's lock.
    pinned = dict(p.lower().split("==") for p in playbook.pins((3, 11)))
    assert pinned["ansible-core"] == lock()["ansible-core"]


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
def test_sdk_pins_give_every_node_python_one_release_of_each_and_match_the_lock(cloud: str) -> None:
    sdks = {
        "aws": {"boto3", "botocore"},
        "alicloud": {
            "alibabacloud-credentials",
            "alibabacloud-tea-openapi",
            "alibabacloud-ess20220222",
            "alibabacloud-cms20190101",
            "alibabacloud-oss-v2",
        },
    }[cloud]
    every = {Requirement(line).name for line in boot.SDK_PINS[cloud]}
    for python in NODE_PYTHONS:
        chosen = selected(cloud, python)
        assert sdks <= set(chosen), (python, sdks - set(chosen))
        # only the backports of what newer Pythons have built in are left out
        missing = every - set(chosen)
        assert missing <= {"backports-zoneinfo", "async-timeout"}, f"{python} lacks {missing}"
    # On Debian 12's 3.11 the node runs what this repository's tests run against.
    pinned, locked = selected(cloud, "3.11.2"), lock()
    differ = {n: (v, locked[n]) for n, v in pinned.items() if n in locked and locked[n] != v}
    assert not differ, f"node pins differ from requirements/constraints.txt: {differ}"
    assert sdks <= set(locked)


METRICS = """# HELP torchfleet_queue_depth Instances waiting in the batch queue.
torchfleet_queue_depth 7.0
torchfleet_requests_total{code="200"} 90.0
torchfleet_requests_total{code="400"} 10.0
torchfleet_gpu_utilization_ratio{gpu="0"} 0.5
torchfleet_gpu_utilization_ratio{gpu="1"} 0.7
"""


def test_scrape_reads_queue_gpu_and_request_rate() -> None:
    values, sample = metrics.scrape(METRICS, None, now_s=100.0)
    assert values["QueueDepth"] == (7.0, "Count")
    assert values["GpuUtilization"][0] == pytest.approx(60.0)
    assert "RequestRate" not in values
    assert sample == {"t": 100.0, "requests": 100.0, "errors": 0.0, "buckets": []}
    later, _ = metrics.scrape(METRICS.replace("90.0", "120.0"), sample, now_s=115.0)
    assert later["RequestRate"] == (pytest.approx(2.0), "Count/Second")
    assert later["RequestCount"] == (30.0, "Count") and later["ErrorCount"] == (0.0, "Count")
    assert "LatencyP99" not in later  # no latency histogram in this exposition
    restarted, _ = metrics.scrape("torchfleet_queue_depth 0\n", sample, now_s=130.0)
    # no GPU, and a counter that went back: the runtime restarted
    assert "RequestRate" not in restarted and "GpuUtilization" not in restarted


def test_interval_figures_from_the_runtimes_own_exposition() -> None:
    """What the node answered between two samples, read from the runtime's real /metrics (its
    Metrics registry): requests, 5xx and the p99 of those requests alone, for CloudMonitor,
    summed over the routes (/v1 and /v2 requests alternate here)."""
    from prometheus_client import generate_latest
    from torchfleet_runtime.metrics import Metrics
    from torchfleet_runtime.v2 import ROUTE_LABELS

    m = Metrics()

    def answer(n: int, seconds: float, code: str) -> None:
        for i in range(n):
            route = ROUTE_LABELS[i % 2]
            m.request_duration.labels(route=route).observe(seconds)
            m.requests.labels(code=code, route=route).inc()

    answer(95, 0.02, "200")
    answer(5, 0.02, "503")
    _, first = metrics.scrape(generate_latest(m.registry).decode(), None, now_s=0.0)
    answer(40, 0.3, "200")  # the interval: slower, and 10 of 50 answered 5xx
    answer(10, 0.3, "500")
    values, second = metrics.scrape(generate_latest(m.registry).decode(), first, now_s=15.0)
    assert values["RequestCount"] == (50.0, "Count")
    assert values["ErrorCount"] == (10.0, "Count")
    # all 50 in the (0.28, 0.33] bucket: p99 interpolated inside it, the first 100 not counted
    assert values["LatencyP99"] == (pytest.approx(0.28 + 0.05 * 0.99), "Seconds")
    assert values["RequestRate"] == (pytest.approx(50 / 15), "Count/Second")
    # a sample after a restart (counters went down): nothing to compare with
    fresh = Metrics()
    fresh.requests.labels(code="200", route=ROUTE_LABELS[0]).inc()
    restarted, _ = metrics.scrape(generate_latest(fresh.registry).decode(), second, now_s=30.0)
    assert not {"RequestCount", "ErrorCount", "LatencyP99"} & set(restarted)


def test_the_agents_p99_resolves_what_the_rollout_guard_is_told_it_does() -> None:
    """LatencyP99 comes from the runtime's own buckets, the bounds CloudMonitorSource says its
    p99s are read from (torchfleet_compat's LATENCY_BOUNDS): an interval 1.2x slower than the
    one before reads about 1.2x slower."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from torchfleet_compat.histogram import LATENCY_BOUNDS
    from torchfleet_runtime.metrics import Metrics
    from torchfleet_runtime.v2 import V1_ROUTE

    m = Metrics()
    text = generate_latest(m.registry).decode()
    exposed = sorted(
        float(s.labels["le"])
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "torchfleet_request_duration_seconds_bucket" and s.labels["le"] != "+Inf"
    )
    assert exposed == list(LATENCY_BOUNDS)  # what CloudMonitorSource.latency_bounds() answers
    p99s = []
    sample = metrics.scrape(text, None, now_s=0.0)[1]
    for i, seconds in enumerate((0.11, 0.132), 1):
        for k in range(100):
            m.request_duration.labels(route=V1_ROUTE).observe(seconds + k * 0.0001)
            m.requests.labels(code="200", route=V1_ROUTE).inc()
        values, sample = metrics.scrape(generate_latest(m.registry).decode(), sample, i * 15.0)
        p99s.append(values["LatencyP99"][0])
    assert p99s[1] / p99s[0] > 1.15, p99s


def test_gpu_utilization_is_the_mean_over_the_gpus_that_serve_a_replica() -> None:
    # devices: [0, 2] on a 4-GPU node: GPUs 1 and 3 idle, not part of this node's saturation
    text = "".join(
        f'torchfleet_gpu_utilization_ratio{{device="{d}",gpu="{g}"}} {u}\n'
        for g, d, u in (("0", "cuda:0", 0.9), ("1", "", 0.0), ("2", "cuda:2", 0.7), ("3", "", 0.0))
    )
    values, _ = metrics.scrape("torchfleet_queue_depth 0\n" + text, None, now_s=1.0)
    assert values["GpuUtilization"] == (pytest.approx(80.0), "Percent")


class Ess:
    """ESS (API 2022-02-22) as the node sees it: its scaling instance, the group's hooks, and
    pending lifecycle actions in its own activity (launch) and another in progress (terminate)."""

    def __init__(self) -> None:
        self.lifecycle_state = "Pending:Wait"

    def __call__(self, action: str, p: dict[str, str]) -> dict[str, Any]:
        if action == "DescribeScalingInstances":
            assert p["ScalingGroupId"] == "asg-1" and p["InstanceIds.1"] == "i-node1", p
            return {
                "ScalingInstances": [
                    {
                        "InstanceId": "i-node1",
                        "LifecycleState": self.lifecycle_state,
                        "ScalingActivityId": "asa-own",
                        "SpotStrategy": "SpotWithPriceLimit",
                    }
                ]
            }
        if action == "DescribeLifecycleHooks":
            return {"LifecycleHooks": [{"LifecycleHookId": "ash-" + p["LifecycleHookName"]}]}
        if action == "DescribeScalingActivities":
            assert p["StatusCode"] == "InProgress", p
            return {"ScalingActivities": [{"ScalingActivityId": "asa-other"}]}
        if action == "DescribeLifecycleActions":
            actions = {
                "asa-own": [
                    {
                        "LifecycleHookId": "ash-torchfleet-launch",
                        "LifecycleActionToken": "tok-launch",
                        "InstanceIds": ["i-node1", "i-node2"],
                    }
                ],
                "asa-other": [
                    {
                        "LifecycleHookId": "ash-torchfleet-terminate",
                        "LifecycleActionToken": "tok-term",
                        "InstanceIds": ["i-node1"],
                    }
                ],
            }
            return {"LifecycleActions": actions.get(p["ScalingActivityId"], [])}
        return {}


METADATA = {
    "instance-id": "i-node1",
    "region-id": "cn-shanghai",
    "instance/instance-type": "ecs.gn6i-c4g1.xlarge",
    "ram/security-credentials/": "torchfleet-node",
    "ram/security-credentials/torchfleet-node": role_credentials(),
}


@pytest.fixture
def alibaba() -> Iterator[FakeAlibaba]:
    with FakeAlibaba(Ess(), METADATA) as fake:
        yield fake


def node_config(fake: FakeAlibaba, **extra: Any) -> boot.NodeConfig:
    cfg: dict[str, Any] = {
        "cloud": "alicloud",
        "region": "cn-shanghai",
        "group_name": "torchfleet-alicloud-prod-ess",
        "group_id": "asg-1",
        "metrics_group_id": "4242",
        "launch_hook": "torchfleet-launch",
        "terminate_hook": "torchfleet-terminate",
        "endpoints": {k: fake.url for k in ("imds", "ess", "cms", "oss")},
        **extra,
    }
    return cfg  # type: ignore[return-value]


def test_alibaba_node_identity_lifecycle_and_metrics_through_the_sdks(alibaba: FakeAlibaba) -> None:
    cloud = cloud_of(node_config(alibaba))
    assert cloud.identity() == {
        "instance_id": "i-node1",
        "region": "cn-shanghai",
        "instance_type": "ecs.gn6i-c4g1.xlarge",
        "spot": True,
        "target": "InService",
    }
    cloud.lifecycle("torchfleet-launch", "CONTINUE", "i-node1")  # its own activity's action
    cloud.lifecycle("torchfleet-terminate", "CONTINUE", "i-node1")  # in the group's activities
    cloud.heartbeat("torchfleet-launch", "i-node1")
    done = [c["params"] for c in alibaba.calls if c["action"] == "CompleteLifecycleAction"]
    assert [
        (c["LifecycleHookId"], c["LifecycleActionToken"], c["LifecycleActionResult"]) for c in done
    ] == [
        ("ash-torchfleet-launch", "tok-launch", "CONTINUE"),
        ("ash-torchfleet-terminate", "tok-term", "CONTINUE"),
    ]
    assert all(c["RegionId"] == "cn-shanghai" and c["ClientToken"] for c in done)
    (beat,) = [
        c["params"] for c in alibaba.calls if c["action"] == "RecordLifecycleActionHeartbeat"
    ]
    # this action's parameters start lower-case in ESS's API (the SDK sends what the API names)
    assert beat == {
        "RegionId": "cn-shanghai",
        "lifecycleHookId": "ash-torchfleet-launch",
        "lifecycleActionToken": "tok-launch",
        "heartbeatTimeout": "600",
    }
    ess = [c for c in alibaba.calls if c["action"] != "PutCustomMetric"]
    assert {c["version"] for c in ess} == {"2022-02-22"}
    assert "DescribeScalingGroups" not in alibaba.actions(), "group_id given: no lookup by name"

    alibaba.answer.lifecycle_state = "Removing:Wait"  # type: ignore[attr-defined]
    assert cloud.target_state() == "Terminated"

    values, _ = metrics.scrape(METRICS, {"t": 0.0, "requests": 70.0}, now_s=15.0)
    cloud.put_metrics(values)
    (put,) = [c for c in alibaba.calls if c["action"] == "PutCustomMetric"]
    p = put["params"]
    assert put["version"] == "2019-01-01"
    sent = {
        p[f"MetricList.{i}.MetricName"]: json.loads(p[f"MetricList.{i}.Values"])
        for i in range(1, 6)
    }
    assert sent == {
        "ErrorCount": {"value": 0.0},
        "GpuUtilization": {"value": pytest.approx(60.0)},
        "QueueDepth": {"value": 7.0},
        "RequestCount": {"value": 30.0},
        "RequestRate": {"value": 2.0},
    }
    assert "MetricList.6.MetricName" not in p
    assert all(
        json.loads(p[f"MetricList.{i}.Dimensions"]) == {"scaling_group": "asg-1"}
        and p[f"MetricList.{i}.GroupId"] == "4242"
        and p[f"MetricList.{i}.Type"] == "0"
        for i in range(1, 6)
    )
    assert alibaba.refused == []
    # The RAM role's credentials came from the metadata service through the SDK (as the proxy of
    # 100.100.100.200), with a token; the agent's own lookups went to the endpoint directly.
    assert ("GET", "/latest/meta-data/ram/security-credentials/torchfleet-node", True) in (
        alibaba.metadata_log
    )
    assert ("GET", "/latest/meta-data/instance-id", False) in alibaba.metadata_log


def test_requests_signed_with_another_secret_are_refused(
    alibaba: FakeAlibaba, tmp_path: Path
) -> None:
    alibaba.secret = "not-the-role-secret"  # what the fake now expects: the SDK's signature fails
    cloud = cloud_of(node_config(alibaba))
    with pytest.raises(Exception, match="SignatureDoesNotMatch"):
        cloud.lifecycle("torchfleet-launch", "CONTINUE", "i-node1")
    alibaba.objects["models-bucket", "models/model.pt"] = b"model-bytes"
    with pytest.raises(Exception, match="SignatureDoesNotMatch|403"):
        boot.fetch_object(
            node_config(alibaba), "models-bucket", "models/model.pt", str(tmp_path / "m")
        )
    assert alibaba.calls == [] and len(alibaba.refused) == 2, alibaba.refused


def test_oss_fetch_with_the_role_credentials(alibaba: FakeAlibaba, tmp_path: Path) -> None:
    alibaba.objects["models-bucket", "models/model.pt"] = b"model-bytes"
    dest = tmp_path / "model.pt"
    boot.fetch_object(node_config(alibaba), "models-bucket", "models/model.pt", str(dest))
    assert dest.read_bytes() == b"model-bytes" and alibaba.refused == []
    assert alibaba.calls == [
        {
            "action": "GetObject",
            "version": "oss",
            "params": {"bucket": "models-bucket", "key": "models/model.pt"},
        }
    ]


def bundle_bytes(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.fixture
def node_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("CONFIG", "STATE", "WORK", "VENV"):
        monkeypatch.setattr(boot, name, str(tmp_path / getattr(boot, name).lstrip("/")))
    return tmp_path


def test_the_stub_fetches_verifies_and_unpacks_the_bundle(
    alibaba: FakeAlibaba, node_files: Path
) -> None:
    good = bundle_bytes({"manifest.json": b"{}", "agent/torchfleet_agent/__init__.py": b""})
    digest = hashlib.sha256(good).hexdigest()
    alibaba.objects["bundles", "bundles/s/good.tar.gz"] = good
    cfg = node_config(
        alibaba, bundle_bucket="bundles", bundle_key="bundles/s/good.tar.gz", bundle_sha256=digest
    )
    tree = Path(boot.fetch_bundle(cfg))
    assert tree == Path(boot.bundle_tree(digest)) and (tree / "agent/torchfleet_agent").is_dir()
    boot.fetch_bundle(cfg)  # verified copy on disk: not fetched again
    assert alibaba.actions() == ["GetObject"]

    tampered = bytearray(good)
    tampered[len(tampered) // 2] ^= 0xFF
    alibaba.objects["bundles", "bundles/s/bad.tar.gz"] = bytes(tampered)
    bad = node_config(
        alibaba, bundle_bucket="bundles", bundle_key="bundles/s/bad.tar.gz", bundle_sha256="0" * 64
    )
    with pytest.raises(boot.Failure) as err:
        boot.fetch_bundle(bad)
    got = hashlib.sha256(bytes(tampered)).hexdigest()
    assert (
        err.value.stage == "verify"
        and got in err.value.message
        and "expected " + "0" * 64 in err.value.message
    )
    assert not Path(boot.bundle_tree("0" * 64)).exists()

    escape = bundle_bytes({"../etc/cron.d/x": b"boom"})
    alibaba.objects["bundles", "bundles/s/escape.tar.gz"] = escape
    sha = hashlib.sha256(escape).hexdigest()
    with pytest.raises(boot.Failure, match="not a plain relative path"):
        boot.fetch_bundle(
            node_config(
                alibaba,
                bundle_bucket="bundles",
                bundle_key="bundles/s/escape.tar.gz",
                bundle_sha256=sha,
            )
        )


def test_a_stub_failure_is_recorded_and_nothing_runs(
    alibaba: FakeAlibaba, node_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = node_config(
        alibaba,
        bundle_bucket="bundles",
        bundle_key="bundles/s/missing.tar.gz",
        bundle_sha256="1" * 64,
        pip_args=[],
    )
    Path(boot.CONFIG).parent.mkdir(parents=True)
    Path(boot.CONFIG).write_text(json.dumps(cfg))
    execs: list[Any] = []
    monkeypatch.setattr(boot.os, "execve", lambda *args: execs.append(args))
    venvs: list[Any] = []
    monkeypatch.setattr(boot, "ensure_venv", lambda *args: venvs.append(args))
    # The node's python3: the bootstrap venv with the cloud's pins, then this file in it.
    monkeypatch.setattr(boot, "in_venv", lambda: False)
    boot.main(["bootstrap"])
    ((python, _version, venv, pins, pip_args),) = venvs
    assert (venv, pins, pip_args) == (boot.VENV, boot.SDK_PINS["alicloud"], [])
    ((exe, argv, env),) = execs
    assert exe == argv[0] == f"{boot.VENV}/bin/python" and argv[1:] == [boot.__file__, "bootstrap"]
    assert float(env["TORCHFLEET_BOOT_STARTED"]) > 0
    execs.clear()
    monkeypatch.setattr(boot, "in_venv", lambda: True)  # continued there: the bundle
    assert boot.main(["bootstrap"]) == 1
    state = json.loads(Path(boot.STATE).read_text())
    assert (
        state["state"] == "failed" and state["stage"] == "fetch" and "NoSuchKey" in state["error"]
    ), state
    assert execs == [] and alibaba.actions() == []
