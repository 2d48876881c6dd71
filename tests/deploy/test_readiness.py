"""Readiness and the smoke prediction against real servers on loopback (the runtime itself, and
a node that is not ready yet), group-mode readiness against mocked AWS APIs (moto), and the
summary's clock arithmetic (working hours, TTL left)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from torchfleet_runtime.app import Service
from torchfleet_runtime.config import Config

from infra import config as stack_config
from infra.deploy import readiness, smoke, summary
from infra.deploy.stage import StageError
from infra.plan import load_stack_config


@pytest.fixture
def runtime():
    torch.manual_seed(0)
    rt = Service(
        Config(port=0, spot_watch="off", input_shape=(4,), max_delay_ms=2.0, log_level="warning"),
        module=torch.nn.Linear(4, 3).eval(),
    )
    rt.start()
    yield f"http://127.0.0.1:{rt.port}"
    rt.close()


def test_smoke_builds_its_body_from_the_nodes_model_card(runtime):
    result = smoke.predict(runtime, "http://10.42.0.90:8080", "ssh tunnel through n0")
    assert result.status == 200 and (result.outputs, result.output_size) == (1, 3)
    assert result.describe().startswith(
        "POST http://10.42.0.90:8080/v1/predict (ssh tunnel through n0) -> 200 in"
    )


def test_look_reports_ready_and_the_batch_cap(runtime):
    node = readiness.NodeState("n0", "127.0.0.1")
    readiness.look(runtime, node)
    assert node.ready
    assert node.model["max_batch_size"] >= 1
    assert node.describe().startswith(f"ready, batch cap {node.model['max_batch_size']}")


class Warming(BaseHTTPRequestHandler):
    """A node still warming up: /readyz 503, no model card yet, predictions refused."""

    def do_GET(self):
        self.send_response(503)
        body = json.dumps({"error": {"type": "not_ready", "message": "warming up"}}).encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def warming():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Warming)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_warming_node_is_not_ready_and_fails_the_smoke_stage(warming, monkeypatch):
    # the smoke stage gives a balancer's 503 BALANCER_WAIT_S (30 s) to pass; one is enough here
    monkeypatch.setattr(smoke, "BALANCER_WAIT_S", 1.0)
    node = readiness.NodeState("n0", "127.0.0.1")
    readiness.look(warming, node)
    assert not node.ready and node.describe() == "NOT ready (/readyz 503)"
    with pytest.raises(StageError) as info:
        smoke.predict(warming, warming, "direct")
    assert info.value.stage == "smoke" and info.value.exit_code == 8
    assert "answered 503" in info.value.message and "client_cidrs" in info.value.fix


# -- group mode (AWS) -------------------------------------------------------------------------


def test_group_is_ready_when_healthy_targets_reach_desired(aws_group, console, text):
    outputs, _ = aws_group
    health = readiness.wait_group("aws-prod", "aws", outputs, console, timeout_s=5, poll_s=0.1)
    assert (health.healthy, health.desired) == (2, 2)
    assert "2/2 healthy targets" in text(console)


def test_the_on_demand_fallback_group_does_not_raise_the_target(aws_group, console):
    """Its nodes fill what the spot group lacks (infra.aws.fallback): the spot group's desired
    size is the target, whatever the fallback group holds."""
    import boto3

    outputs, _ = aws_group
    discovery = outputs["discovery"]
    asg = boto3.client("autoscaling", region_name=discovery["region"])
    (spot,) = asg.describe_auto_scaling_groups()["AutoScalingGroups"]
    asg.create_auto_scaling_group(
        AutoScalingGroupName=discovery["fallback_group_name"],
        MinSize=0,
        MaxSize=8,
        DesiredCapacity=1,  # bootstrapping: not yet a healthy target
        VPCZoneIdentifier=spot["VPCZoneIdentifier"],
        LaunchTemplate={"LaunchTemplateName": "fleet-lt"},
        Tags=[
            {"Key": t["Key"], "Value": t["Value"], "PropagateAtLaunch": True} for t in spot["Tags"]
        ],
    )
    health = readiness.wait_group("aws-prod", "aws", outputs, console, timeout_s=5, poll_s=0.1)
    assert (health.healthy, health.desired) == (2, 2)


def test_group_short_of_desired_fails_the_readiness_stage(aws_group, console):
    outputs, ec2 = aws_group
    node = ec2.describe_instances()["Reservations"][0]["Instances"][0]["InstanceId"]
    ec2.stop_instances(InstanceIds=[node])  # its target turns "unused"
    with pytest.raises(StageError) as info:
        readiness.wait_group("aws-prod", "aws", outputs, console, timeout_s=0.3, poll_s=0.1)
    assert info.value.stage == "readiness" and "1/2 healthy targets" in info.value.message
    assert any(node in d and "unused" in d for d in info.value.details)


def test_group_on_alicloud_says_it_is_not_read(console, text):
    assert readiness.wait_group("alicloud-prod", "alicloud", {}, console, 1) is None
    assert "DescribeHealthStatus" in text(console)


# -- summary arithmetic -----------------------------------------------------------------------


def aws_dev():
    return stack_config.load(
        stack_config.raw_from_pulumi_config(load_stack_config("aws-dev")), "aws-dev"
    )


@pytest.mark.parametrize(
    ("utc", "running"),
    [
        ("2026-03-02T10:17:00Z", True),  # Monday 11:17 in Berlin
        ("2026-03-02T18:30:00Z", False),  # Monday 19:30 in Berlin, after the stop
        ("2026-03-07T10:00:00Z", False),  # Saturday
    ],
)
def test_cost_now_follows_the_working_hours(utc, running):
    cfg = aws_dev()
    now = datetime.fromisoformat(utc.replace("Z", "+00:00"))
    assert summary.in_working_hours(cfg.schedule, now) is running
    cost = {
        "nodes": 1,
        "on_demand_nodes": 0,
        "spot_nodes": 1,
        "on_demand_per_hour": 0.8048,
        "spot_cap_per_hour": 0.7243,
        "spot_typical_per_hour": 0.3622,
        "rest_per_hour": 0.0152,
        "currency": "USD",
    }
    line = summary.cost_now(cost, cfg, now)
    assert line.startswith(
        "0.362 USD/h typical, at most 0.724 USD/h"
        if running
        else "0.015 USD/h now (the rest of the bill): outside working hours"
    )


def test_ttl_left():
    now = datetime(2026, 3, 2, 10, 17, tzinfo=UTC)
    assert summary.ttl_left("2026-03-02T23:00:00Z", now).startswith("12 h 43 min left")
    assert summary.ttl_left("2026-03-02T09:00:00Z", now).startswith("expired")
    assert summary.ttl_left(None, now).startswith("none")
