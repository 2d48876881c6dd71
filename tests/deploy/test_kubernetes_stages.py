"""`torchfleet up|status` on a mode: kubernetes stack, over real HTTP on loopback: a small fake
Kubernetes API server (the Deployment and Service reads the stages make, answered from a dict
the test changes, refusing any other bearer token), a kubeconfig pointing at it, read by the
official client, and the runtime itself behind the "load balancer" for the smoke prediction.
Every wait runs on an injected clock, so a timeout takes no real time."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch
import yaml
from torchfleet_runtime.app import Service
from torchfleet_runtime.config import Config

from infra import config as stack_config
from infra.deploy import kubernetes, pipeline
from infra.deploy.stage import StageError
from infra.plan import load_stack_config

KUBE_TOKEN = "k8s-test-token"
API_TOKEN = "tf_test_api_token_0123456789abcdef"
LB_HOST = "a1b2c3-lb.elb.eu-central-1.example.test"


class FakeApi:
    """GET /apis/apps/v1/namespaces/NS/deployments/NAME and /api/v1/namespaces/NS/services/NAME
    from `deployments` / `services` (name -> counts / ingress); 404 for anything else, 401
    without the kubeconfig's bearer token."""

    def __init__(self) -> None:
        self.deployments: dict[tuple[str, str], dict[str, int]] = {}
        self.services: dict[tuple[str, str], list[dict[str, str]]] = {}
        self.seen: list[tuple[str, str | None]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api.seen.append((self.path, self.headers.get("Authorization")))
                if self.headers.get("Authorization") != f"Bearer {KUBE_TOKEN}":
                    return self._send(
                        401, {"kind": "Status", "code": 401, "reason": "Unauthorized"}
                    )
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:4] == ["apis", "apps", "v1", "namespaces"] and parts[5] == "deployments":
                    found = api.deployments.get((parts[4], parts[6]))
                    if found is not None:
                        return self._send(200, _deployment(parts[4], parts[6], found))
                if parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "services":
                    ingress = api.services.get((parts[3], parts[5]))
                    if ingress is not None:
                        return self._send(200, _service(parts[3], parts[5], ingress))
                self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})

            def _send(self, code: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self, token: str = KUBE_TOKEN) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "users": [{"name": "fake", "user": {"token": token}}],
            }
        )

    def gets(self, kind: str) -> int:
        return sum(f"/{kind}/" in path for path, _ in self.seen)


def _deployment(ns: str, name: str, counts: dict[str, int]) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "torchfleet-runtime"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": counts["replicas"],
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}},
        },
        "status": {
            k: v
            for k, v in {
                "readyReplicas": counts.get("ready", 0),
                "availableReplicas": counts.get("available", 0),
                "updatedReplicas": counts.get("updated", counts["replicas"]),
            }.items()
            if v  # the API server leaves zero counts out
        },
    }


def _service(ns: str, name: str, ingress: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 443, "targetPort": "http"}]},
        "status": {"loadBalancer": {"ingress": ingress} if ingress else {}},
    }


@pytest.fixture
def api():
    fake = FakeApi()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def runtime():
    """The runtime, answering /v1/* only with the stack's API token."""
    torch.manual_seed(0)
    rt = Service(
        Config(
            port=0,
            spot_watch="off",
            input_shape=(4,),
            max_delay_ms=2.0,
            log_level="warning",
            api_token=API_TOKEN,
        ),
        module=torch.nn.Linear(4, 3).eval(),
    )
    rt.start()
    yield f"http://127.0.0.1:{rt.port}"
    rt.close()


@pytest.fixture
def cfg():
    return stack_config.load(
        stack_config.raw_from_pulumi_config(load_stack_config("aws-k8s")), "aws-k8s"
    )


def outputs_of(api: FakeApi, cfg, **extra: Any) -> dict[str, Any]:
    from infra.k8s.workload import names

    return {
        "endpoint": "pending (the load balancer gets its address when the Service is created)",
        "kubeconfig": api.kubeconfig(),
        "workload": names(cfg),
        "api_token": API_TOKEN,
        "cost": None,
        "ttl_expiry": None,
        **extra,
    }


class Clock:
    """now() and sleep() on a fake timeline; `on_sleep` lets the cluster change between looks."""

    def __init__(self, on_sleep=None) -> None:
        self.t, self.sleeps, self.on_sleep = 0.0, 0, on_sleep

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.sleeps += 1
        if self.on_sleep:
            self.on_sleep(self.sleeps)


def _up(api, cfg, console, tmp_path, clock, resolve=None, outputs=None):
    steps = pipeline.Steps(console, 4)
    opts = pipeline.NodeOptions(
        kubernetes=kubernetes.Options(
            timeout_s=60, poll_s=10, clock=clock.now, sleep=clock.sleep, resolve=resolve
        )
    )
    return pipeline.node_stages(
        "aws-k8s", outputs or outputs_of(api, cfg), cfg, steps, console, tmp_path, opts
    )


NS, DEPLOY, SVC = "torchfleet", "torchfleet-runtime", "torchfleet-runtime"


def test_replicas_not_available_wait_then_time_out_naming_the_deployment(
    api, cfg, console, text, tmp_path
):
    api.deployments[(NS, DEPLOY)] = {"replicas": 2, "ready": 1, "available": 1}
    api.services[(NS, SVC)] = [{"hostname": LB_HOST}]
    clock = Clock()
    with pytest.raises(StageError) as err:
        _up(api, cfg, console, tmp_path, clock)
    e = err.value
    assert e.stage == "readiness" and e.exit_code == 7
    assert (
        f"Deployment {NS}/{DEPLOY}: 1/2 available, 1 ready, 2 updated" in e.message
        and "60 s" in e.message
    ), e.message
    assert "Service" not in e.message  # the load balancer had its address
    # it waited: a look every 10 s for 60 s, on the fake clock
    assert clock.sleeps == 6 and api.gets("deployments") >= 7
    assert "no inventory" in text(console) and "nothing to converge" in text(console)
    # every read carried the kubeconfig's bearer token
    assert {auth for _, auth in api.seen} == {f"Bearer {KUBE_TOKEN}"}


def test_a_service_without_load_balancer_ingress_is_named(api, cfg, console, tmp_path):
    api.deployments[(NS, DEPLOY)] = {"replicas": 1, "ready": 1, "available": 1}
    api.services[(NS, SVC)] = []
    with pytest.raises(StageError) as err:
        _up(api, cfg, console, tmp_path, Clock())
    assert f"Service {NS}/{SVC}: no load-balancer ingress yet" in err.value.message
    assert "Deployment" not in err.value.message


def test_a_missing_deployment_and_a_refused_token_are_named(api, cfg, console, tmp_path):
    with pytest.raises(StageError) as err:
        _up(api, cfg, console, tmp_path, Clock())
    assert f"Deployment {NS}/{DEPLOY}: not found" in err.value.message
    outputs = outputs_of(api, cfg, kubeconfig=api.kubeconfig(token="wrong"))
    with pytest.raises(StageError) as err:
        _up(api, cfg, console, tmp_path, Clock(), outputs=outputs)
    assert "the Kubernetes API: 401 Unauthorized" in err.value.message


def test_ready_then_one_prediction_through_the_load_balancer_with_the_token(
    api, cfg, console, text, tmp_path, runtime
):
    api.deployments[(NS, DEPLOY)] = {"replicas": 2, "ready": 0, "available": 0}
    api.services[(NS, SVC)] = []

    def progress(n: int) -> None:  # the pods warm up, then the cloud assigns the LB
        if n == 1:
            api.deployments[(NS, DEPLOY)] = {"replicas": 2, "ready": 2, "available": 2}
        if n == 2:
            api.services[(NS, SVC)] = [{"hostname": LB_HOST}]

    clock = Clock(progress)
    resolved: list[str] = []

    def resolve(endpoint: str) -> str:  # the load balancer's DNS name -> the runtime here
        resolved.append(endpoint)
        return runtime

    summary = _up(api, cfg, console, tmp_path, clock, resolve=resolve)
    assert clock.sleeps == 2
    # the endpoint is the Service's load balancer (https: aws-k8s's NLB ends TLS)
    assert resolved == [f"https://{LB_HOST}/"]
    assert summary.prediction is not None and summary.prediction.status == 200
    assert (summary.prediction.outputs, summary.prediction.output_size) == (1, 3)
    lines = "\n".join(summary.lines())
    assert f"endpoint    https://{LB_HOST}/" in lines
    assert f"Deployment {NS}/{DEPLOY}: 2/2 available" in lines
    assert f"Service {NS}/{SVC}: load balancer {LB_HOST}" in lines


def test_the_smoke_fails_without_the_stacks_token(api, cfg, console, tmp_path, runtime):
    api.deployments[(NS, DEPLOY)] = {"replicas": 1, "ready": 1, "available": 1}
    api.services[(NS, SVC)] = [{"ip": "203.0.113.10"}]
    outputs = outputs_of(api, cfg, api_token="tf_not_the_token_0123456789abcdef")
    with pytest.raises(StageError) as err:
        _up(api, cfg, console, tmp_path, Clock(), resolve=lambda _: runtime, outputs=outputs)
    assert err.value.stage == "smoke" and "401" in err.value.message


def test_status_shows_both_tracks_and_the_service(api, cfg):
    api.deployments[(NS, DEPLOY)] = {"replicas": 2, "ready": 2, "available": 2}
    api.deployments[(NS, f"{DEPLOY}-candidate")] = {"replicas": 1, "ready": 0, "available": 0}
    api.services[(NS, SVC)] = [{"ip": "203.0.113.10"}]
    summary = pipeline.status_of("aws-k8s", outputs_of(api, cfg), cfg, pipeline.INVENTORIES, None)
    assert summary.pods == [
        f"Deployment {NS}/{DEPLOY}: 2/2 available, 2 ready, 2 updated",
        f"Deployment {NS}/{DEPLOY}-candidate: 0/1 available, 0 ready, 1 updated (track: candidate)",
        f"Service {NS}/{SVC}: load balancer 203.0.113.10",
    ]
    assert summary.unready == []
    lines = "\n".join(summary.lines())
    assert "endpoint    https://203.0.113.10/" in lines and "ttl " in lines
    # a Deployment short of its desired count makes `status` exit with readiness's code
    api.deployments[(NS, DEPLOY)] = {"replicas": 2, "ready": 1, "available": 1}
    summary = pipeline.status_of("aws-k8s", outputs_of(api, cfg), cfg, pipeline.INVENTORIES, None)
    assert summary.unready == [f"Deployment {NS}/{DEPLOY}: 1/2 available, 1 ready, 2 updated"]


def test_outputs_without_a_kubeconfig_say_so(cfg, console, tmp_path):
    outputs = {"endpoint": "x", "workload": {"namespace": NS}, "api_token": API_TOKEN}
    with pytest.raises(StageError) as err:
        pipeline.status_of("aws-k8s", outputs, cfg, pipeline.INVENTORIES, None)
    assert err.value.stage == "inventory" and "workload" in err.value.message
    outputs["workload"] = {
        "namespace": NS,
        "deployment": DEPLOY,
        "candidate_deployment": f"{DEPLOY}-candidate",
        "service": SVC,
    }
    with pytest.raises(StageError, match="no `kubeconfig` output"):
        pipeline.status_of("aws-k8s", outputs, cfg, pipeline.INVENTORIES, None)


def test_down_says_it_destroys_the_cluster(cfg):
    said = pipeline.what_down_destroys(cfg)
    assert "cluster" in said and "load balancer" in said
    assert "cluster" not in pipeline.what_down_destroys(None)
