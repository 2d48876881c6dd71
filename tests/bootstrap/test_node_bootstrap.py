"""THE PROOF of issue 8: the real rendered user-data boots a bare systemd node (Debian 12 +
cloud-init, NoCloud seed) into a serving, group-joined node with no Ansible run from outside:
the user-data's stub makes the bootstrap venv (boto3 from the mounted wheelhouse), fetches the
bundle with the instance role's credentials, verifies it and runs the agent the bundle carries.

One podman pod = one network namespace: the node (a systemd container of
localhost/torchfleet-bookworm-cloudinit) and, in a second container, moto in server mode (S3,
Auto Scaling, CloudWatch, EC2) plus a fake IMDSv2, both on the pod's loopback where the node's
user-data points (BootstrapSpec.endpoints). The test sets moto up through the pod's port
published on the host's 127.0.0.1 only. The node fetches the bundle and the model from moto's
S3 with the instance role's credentials from the fake IMDS, runs site.yml on itself, and
completes its launch lifecycle action in moto's Auto Scaling.

  cold     bare node -> ready; /readyz 200 and a prediction inside the node; CONTINUE seen by
           moto; QueueDepth in moto's CloudWatch; the terminating watcher drains the runtime and
           completes its action; then prepare-image (the bake) powers it off and `podman commit`
           makes the baked image, which keeps no identity of the node
  corrupt  a bundle whose bytes do not match the checksum: the stub refuses it (failed, both
           checksums named, nothing unpacked, no agent run, so no lifecycle action completed:
           the hook's default result applies at its timeout)
  baked    the baked image with mode baked -> ready through playbooks/baked.yml; a reboot asked
           for mid-bootstrap (/run/reboot-required, what a new driver or kernel does) resumes
           it on the next boot: the unit runs again, the play again from the top, nothing left
           to change

Each test prints its wall time; torch comes from the mounted wheelhouse, never an index.
TORCHFLEET_BOOTSTRAP_KEEP=1 keeps the pod and its nodes for a look inside."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from nodekit import (
    REPO,
    bootstrap_wheels_for,
    free_port,
    node_image_for,
    podman,
    sha256,
    torch_wheelhouse_for,
)

from infra import bundle as bundle_mod
from infra.bootstrap import BootstrapSpec, render_user_data
from infra.bootstrap.torchfleet_agent import playbook

pytestmark = [pytest.mark.molecule, pytest.mark.timeout(2400)]
KEEP = bool(os.environ.get("TORCHFLEET_BOOTSTRAP_KEEP"))
# A cold node installs python3-venv, the bootstrap pins, torch and the runtime: minutes on a
# quiet 2-core machine, many more when it is shared. Bounded all the same.
COLD_S, BAKED_S = 1800, 900

STACK, REGION = "aws-prod", "us-east-1"
GROUP, LAUNCH, TERMINATE = "torchfleet-aws-prod-asg", "torchfleet-launch", "torchfleet-terminate"
BUNDLES, MODELS = "torchfleet-aws-prod-bundles", "torchfleet-test-models"
MOTO_PORT, IMDS_PORT = 5000, 1338
TOKEN = "bootstrap-test-token-0123456789"
INSTANCE_TYPE = "m7i.large"  # not a GPU type of the catalog: preflight detects no GPU itself


@dataclass
class Fakes:
    pod: str
    state: Path  # shared with the fakes container: imds.json, imds.log, lifecycle.jsonl
    url: str  # moto, from the host
    bundle: bundle_mod.Bundle
    model_sha256: str
    images: list[str] = field(default_factory=list)
    baked_image: str | None = None
    booted: set[str] = field(default_factory=set)  # instance ids a node has been

    def client(self, service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )

    def lifecycle(self) -> list[dict[str, Any]]:
        path = self.state / "lifecycle.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def free_instance(self) -> str:
        """An instance of the group that no node has been yet (moto replaces the ones a node
        abandoned or terminated, as the group would)."""
        used = self.booted | {e["instance"] for e in self.lifecycle()}
        groups = self.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[GROUP]
        )
        return next(
            i["InstanceId"]
            for i in groups["AutoScalingGroups"][0]["Instances"]
            if i["InstanceId"] not in used
        )

    def imds(self, instance_id: str, target: str = "InService") -> None:
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 6 * 3600))
        answers = {
            "instance-id": instance_id,
            "instance-type": INSTANCE_TYPE,
            "placement/region": REGION,
            "placement/availability-zone": f"{REGION}a",
            "instance-life-cycle": "on-demand",
            "autoscaling/target-lifecycle-state": target,
            "iam/security-credentials/": "torchfleet-node",
            "iam/security-credentials/torchfleet-node": {
                "Code": "Success",
                "Type": "AWS-HMAC",
                "AccessKeyId": "ASIANODEROLE",
                "SecretAccessKey": "node-role-secret",
                "Token": "node-role-session",
                "LastUpdated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "Expiration": expires,
            },
        }
        tmp = self.state / "imds.json.tmp"
        tmp.write_text(json.dumps(answers))
        tmp.replace(self.state / "imds.json")


@dataclass
class Node:
    name: str
    instance_id: str
    started: float

    def sh(self, script: str, check: bool = True, timeout: int = 120) -> str:
        out = podman("exec", self.name, "/bin/sh", "-c", script, check=check, timeout=timeout)
        return out.stdout

    def state(self) -> dict[str, Any]:
        """The node's state file, running or stopped (podman cp reads a stopped container)."""
        with tempfile.TemporaryDirectory() as tmp:
            out = podman("cp", f"{self.name}:/var/lib/torchfleet/bootstrap.json", tmp, check=False)
            path = Path(tmp, "bootstrap.json")
            if out.returncode != 0 or not path.exists():
                return {}
            try:
                return json.loads(path.read_text())
            except ValueError:  # caught mid-write
                return {}

    def running(self) -> bool:
        return (
            podman(
                "inspect", self.name, "--format", "{{.State.Running}}", check=False
            ).stdout.strip()
            == "true"
        )

    def journal(self, unit: str = "torchfleet-bootstrap") -> str:
        return self.sh(f"journalctl -u {unit} --no-pager -o cat", check=False)


def _json_from_node(node: Node, path: str) -> dict[str, Any]:
    text = node.sh(f"cat {path} 2>/dev/null || true", check=False)
    return json.loads(text) if text.strip() else {}


def wait_for(what: str, probe, timeout: float, interval: float = 2.0, node: Node | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\nstate {node.state()}\njournal:\n{node.journal()[-4000:]}" if node else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def _group_vars(tmp: Path, model: Path) -> Path:
    """The test stack's group vars: a CPU node (no stack config can describe one), torch from
    the mounted wheelhouse, the model from moto's S3 through the node agent."""
    gv = tmp / "group_vars"
    gv.mkdir()
    (gv / "all.yml").write_text(
        yaml.safe_dump(
            {
                "torchfleet_cloud": "aws",
                "torchfleet_env": "prod",
                "pytorch_wheelhouse": "/opt/wheelhouse",
                "pytorch_wheelhouse_on_node": True,
                "inference_runtime_model_source": f"s3://{MODELS}/models/model.pt",
                "inference_runtime_model_checksum": f"sha256:{sha256(model / 'model.pt')}",
                "inference_runtime_metadata_source": f"s3://{MODELS}/models/model.json",
                "inference_runtime_metadata_checksum": f"sha256:{sha256(model / 'model.json')}",
                "inference_runtime_drain_timeout_s": 5,
                "autostop_enabled": False,
                # the node listens on every address, so it serves /v1/* only with a token (a
                # stack's nodes read theirs from the cloud's secret; this test stack has none)
                "inference_runtime_api_token": TOKEN,
                # warm-up on a shared 2-core machine can outlast the role's default 3 minutes
                "inference_runtime_ready_retries": 300,
            },
            sort_keys=True,
        )
    )
    return gv


@pytest.fixture(scope="module")
def fakes(
    tmp_path_factory, node_image, moto_site, bootstrap_wheels, demo_model, torch_wheelhouse
) -> Iterator[Fakes]:
    tmp = tmp_path_factory.mktemp("bootstrap")
    facts = {
        "group_vars": {
            "torchfleet_cloud": "aws",
            "torchfleet_env": "prod",
            "torchfleet_cuda_profile": "cpu",
            "torchfleet_gpu_model": "",
            "torchfleet_compute_capability": "",
            "torchfleet_instance_type": INSTANCE_TYPE,
            "torchfleet_spot": False,
        },
        "instance_types": bundle_mod.stack_facts(STACK)["instance_types"],
    }
    bundle = bundle_mod.build(STACK, tmp, group_vars=_group_vars(tmp, demo_model), facts=facts)
    suffix = secrets.token_hex(3)
    pod, state = f"torchfleet-fleet-node-boot-{suffix}", tmp / "state"
    state.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    f = Fakes(
        pod=pod, state=state, url=url, bundle=bundle, model_sha256=sha256(demo_model / "model.pt")
    )
    try:
        podman("pod", "create", "--name", pod, "-p", f"127.0.0.1:{port}:{MOTO_PORT}")
        # moto listens on the pod's addresses (the host reaches it through the published port,
        # the node on 127.0.0.1); the fake IMDS on the pod's loopback only.
        podman(
            "run",
            "-d",
            "--pod",
            pod,
            "--name",
            f"{pod}-aws",
            "-v",
            f"{moto_site}:/opt/moto:ro",
            "-v",
            f"{REPO / 'tests' / 'bootstrap'}:/opt/fakes:ro",
            "-v",
            f"{state}:/state",
            "-e",
            "PYTHONPATH=/opt/moto",
            "localhost/torchfleet-bookworm:latest",
            "/bin/sh",
            "-c",
            f"python3 /opt/fakes/fake_imds.py {IMDS_PORT} /state & "
            f"exec python3 /opt/fakes/moto_server.py 0.0.0.0 {MOTO_PORT} /state",
        )
        try:
            wait_for("moto", lambda: _answers(url), 90, 0.5)
        except AssertionError as err:
            logs = podman("logs", f"{pod}-aws", check=False)
            raise AssertionError(f"{err}\n{logs.stdout[-2000:]}{logs.stderr[-2000:]}") from None
        _aws_setup(f, demo_model)
        yield f
    finally:
        if not KEEP:
            podman("pod", "rm", "-f", "-t", "5", pod, check=False, timeout=120)
            for image in f.images:
                podman("rmi", "-f", image, check=False)


def _answers(url: str) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(url + "/moto-api/", timeout=2)
        return True
    except OSError:
        return False


def _aws_setup(f: Fakes, model: Path) -> None:
    s3 = f.client("s3")
    for bucket in (BUNDLES, MODELS):
        s3.create_bucket(Bucket=bucket)
    s3.upload_file(str(f.bundle.path), BUNDLES, f.bundle.key)
    for name in ("model.pt", "model.json"):
        s3.upload_file(str(model / name), MODELS, f"models/{name}")
    f.client("ec2").create_launch_template(
        LaunchTemplateName="torchfleet-aws-prod-node",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": INSTANCE_TYPE},
    )
    asg = f.client("autoscaling")
    asg.create_auto_scaling_group(
        AutoScalingGroupName=GROUP,
        MinSize=1,
        MaxSize=2,
        DesiredCapacity=1,
        LaunchTemplate={"LaunchTemplateName": "torchfleet-aws-prod-node"},
        AvailabilityZones=[f"{REGION}a"],
    )
    for hook, transition, default in (
        (LAUNCH, "LAUNCHING", "ABANDON"),
        (TERMINATE, "TERMINATING", "CONTINUE"),
    ):
        asg.put_lifecycle_hook(
            AutoScalingGroupName=GROUP,
            LifecycleHookName=hook,
            LifecycleTransition=f"autoscaling:EC2_INSTANCE_{transition}",
            HeartbeatTimeout=600,
            DefaultResult=default,
        )


def _spec(f: Fakes, mode: str, key: str | None = None) -> BootstrapSpec:
    local = f"http://127.0.0.1:{MOTO_PORT}"
    return BootstrapSpec(
        cloud="aws",
        region=REGION,
        stack=STACK,
        bundle_bucket=BUNDLES,
        bundle_key=key or f.bundle.key,
        bundle_sha256=f.bundle.sha256,
        mode=mode,
        group_name=GROUP,
        launch_hook=LAUNCH,
        terminate_hook=TERMINATE,
        endpoints={
            "s3": local,
            "autoscaling": local,
            "cloudwatch": local,
            "imds": f"http://127.0.0.1:{IMDS_PORT}",
        },
        pip_args=("--no-index", "--find-links", "/opt/bootstrap-wheels"),
    )


def boot(f: Fakes, image: str, spec: BootstrapSpec, tmp: Path, wheels: Path, torch: Path) -> Node:
    """Start a node the way the cloud does: a fresh machine with only a NoCloud seed."""
    instance = f.free_instance()
    f.booted.add(instance)
    f.imds(instance)
    seed = tmp / f"seed-{instance}"
    seed.mkdir()
    (seed / "meta-data").write_text(f"instance-id: {instance}\nlocal-hostname: {instance}\n")
    (seed / "user-data").write_text(render_user_data(spec))
    name = f"{f.pod}-{instance}"
    started = time.monotonic()
    podman(
        "run",
        "-d",
        "--pod",
        f.pod,
        "--name",
        name,
        "--systemd=always",
        "-v",
        f"{seed}:/var/lib/cloud/seed/nocloud:ro",
        "-v",
        f"{torch}:/opt/wheelhouse:ro",
        "-v",
        f"{wheels}:/opt/bootstrap-wheels:ro",
        image,
        "/sbin/init",
    )
    return Node(name=name, instance_id=instance, started=started)


def settle(node: Node, timeout: float) -> dict[str, Any]:
    return wait_for(
        f"{node.name} to be ready or failed",
        lambda: (s := node.state()).get("state") in ("ready", "failed") and s,
        timeout,
        node=node,
    )


def remove(node: Node) -> None:
    if not KEEP:
        podman("rm", "-f", "-t", "5", node.name, check=False)


def _get(node: Node, path: str) -> str:
    return node.sh(
        "python3 -c \"import urllib.request as u; r=u.urlopen('http://127.0.0.1:8080"
        f"{path}', timeout=10); print(r.status); print(r.read().decode())\""
    )


def _predict(node: Node) -> dict[str, Any]:
    script = (
        "import json, urllib.request as u; body=json.dumps({'inputs': [[[[0.5]*64]*64]*3]}).encode(); "
        "r=u.urlopen(u.Request('http://127.0.0.1:8080/v1/predict', data=body, "
        f"headers={{'Content-Type': 'application/json', 'Authorization': 'Bearer {TOKEN}'}}), "
        "timeout=30); print(r.read().decode())"
    )
    return json.loads(node.sh(f'python3 -c "{script}"'))


def test_cold_boot_joins_serves_publishes_drains_and_bakes(
    fakes: Fakes, tmp_path, bootstrap_wheels, torch_wheelhouse, node_image
) -> None:
    node = boot(
        fakes, node_image, _spec(fakes, "cold"), tmp_path, bootstrap_wheels, torch_wheelhouse
    )
    try:
        state = settle(node, COLD_S)
        seconds = time.monotonic() - node.started
        assert state["state"] == "ready", f"{state}\n{node.journal()[-4000:]}"
        assert state["mode"] == "cold" and state["boots"] == 1, state
        assert [(p["playbook"], p["rc"]) for p in state["plays"]] == [("site.yml", 0)], state[
            "plays"
        ]
        assert state["lifecycle"] == {LAUNCH: "CONTINUE"}, state

        ready = _get(node, "/readyz")
        assert ready.splitlines()[0] == "200", ready
        outputs = _predict(node)["outputs"]
        assert len(outputs) == 1 and len(outputs[0]) == 10, outputs
        done = [
            e
            for e in fakes.lifecycle()
            if e["instance"] == node.instance_id and e["call"] == "CompleteLifecycleAction"
        ]
        assert done == [
            {
                "call": "CompleteLifecycleAction",
                "group": GROUP,
                "hook": LAUNCH,
                "instance": node.instance_id,
                "result": "CONTINUE",
                "accepted": True,
            }
        ], done
        beats = [
            e
            for e in fakes.lifecycle()
            if e["call"] == "RecordLifecycleActionHeartbeat" and e["instance"] == node.instance_id
        ]
        assert beats and all(b["accepted"] for b in beats) or state["seconds"] < 130, beats
        # The bundle and the model came from S3 with the instance role's credentials, IMDSv2 only.
        imds_log = (fakes.state / "imds.log").read_text()
        assert "GET /latest/meta-data/iam/security-credentials/torchfleet-node 200" in imds_log
        assert " 401" not in imds_log, "a metadata request without an IMDSv2 token"
        model = node.sh("sha256sum /var/lib/torchfleet/models/model/model.pt").split()[0]
        assert model == fakes.model_sha256

        cloudwatch = fakes.client("cloudwatch")
        metrics = wait_for(
            "QueueDepth in CloudWatch",
            lambda: cloudwatch.list_metrics(Namespace="torchfleet", MetricName="QueueDepth")[
                "Metrics"
            ],
            90,
            node=node,
        )
        assert metrics[0]["Dimensions"] == [{"Name": "AutoScalingGroupName", "Value": GROUP}], (
            metrics
        )
        assert not cloudwatch.list_metrics(Namespace="torchfleet", MetricName="RequestRate")[
            "Metrics"
        ]

        # Scale-in: the group marks the node Terminated; the watcher drains, then continues.
        fakes.imds(node.instance_id, target="Terminated")
        wait_for(
            "the terminate action",
            lambda: [
                e
                for e in fakes.lifecycle()
                if e["hook"] == TERMINATE and e["instance"] == node.instance_id
            ],
            120,
            node=node,
        )
        assert (
            node.sh("systemctl is-active torchfleet-runtime.service", check=False).strip()
            == "inactive"
        )
        assert "terminating: draining the runtime" in node.journal("torchfleet-lifecycle")
        print(
            f"\ncold bootstrap: bare node -> ready {seconds:.0f} s wall (agent {state['seconds']} s, "
            f"site.yml {state['plays'][0]['seconds']} s), stages {state['stages']}"
        )

        # The bake: forget this node, power off; the stopped machine becomes the image.
        node.sh(
            "systemd-run --unit torchfleet-prepare-image /usr/local/sbin/torchfleet-node prepare-image"
        )
        wait_for("the node to power off", lambda: not node.running(), 300, node=node)
        image = f"localhost/{fakes.pod}-baked:latest"
        podman("commit", node.name, image, timeout=900)
        fakes.images.append(image)
        leftovers = podman(
            "run",
            "--rm",
            "--entrypoint",
            "/bin/sh",
            image,
            "-c",
            "test -s /etc/machine-id && echo machine-id; ls /etc/ssh/ssh_host_* 2>/dev/null; "
            "ls /var/lib/cloud/instance /var/lib/torchfleet/bootstrap.json /etc/torchfleet/node.json "
            "/var/lib/torchfleet/models /etc/systemd/system/multi-user.target.wants/torchfleet-runtime.service "
            "2>/dev/null; true",
        ).stdout
        assert leftovers.strip() == "", (
            f"the baked image keeps node identity or state:\n{leftovers}"
        )
        fakes.baked_image = image
    finally:
        remove(node)


def test_corrupt_bundle_is_refused_by_the_stub_naming_both_checksums(
    fakes: Fakes, tmp_path, bootstrap_wheels, torch_wheelhouse, node_image
) -> None:
    tampered = tmp_path / "tampered.tar.gz"
    data = bytearray(fakes.bundle.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    key = f"bundles/{STACK}/tampered.tar.gz"
    fakes.client("s3").upload_file(str(tampered), BUNDLES, key)
    node = boot(
        fakes, node_image, _spec(fakes, "cold", key), tmp_path, bootstrap_wheels, torch_wheelhouse
    )
    try:
        state = settle(node, COLD_S)
        assert state["state"] == "failed" and state["stage"] == "verify", state
        assert fakes.bundle.sha256 in state["error"] and sha256(tampered) in state["error"], state
        journal = node.journal()
        assert f"expected {fakes.bundle.sha256}" in journal and sha256(tampered) in journal, (
            journal[-3000:]
        )
        assert (
            node.sh(
                "test -e /var/lib/torchfleet/bootstrap/bundle-* && echo unpacked || true"
            ).strip()
            == ""
        )
        # The stub never ran the unverified bundle's agent: no lifecycle call came from the node
        # (moto has no hook timeouts; on AWS the launch hook's default result, ABANDON, applies).
        assert [e for e in fakes.lifecycle() if e["instance"] == node.instance_id] == []
        assert "FAILED in stage verify" in journal, journal[-3000:]
        # What the hook's timeout does on AWS (moto has none): the group abandons the launch and
        # replaces the instance, for the tests after this one.
        fakes.client("autoscaling").complete_lifecycle_action(
            LifecycleHookName=LAUNCH,
            AutoScalingGroupName=GROUP,
            InstanceId=node.instance_id,
            LifecycleActionResult="ABANDON",
        )
        print(
            f"\ncorrupt bundle: refused by the stub after {time.monotonic() - node.started:.0f} s"
        )
    finally:
        remove(node)


def test_baked_image_checks_pins_fetches_model_warms_and_resumes_after_a_reboot(
    fakes: Fakes, tmp_path, bootstrap_wheels, torch_wheelhouse
) -> None:
    if not fakes.baked_image:
        pytest.skip("no baked image: the cold boot test failed before the bake")
    node = boot(
        fakes,
        fakes.baked_image,
        _spec(fakes, "baked"),
        tmp_path,
        bootstrap_wheels,
        torch_wheelhouse,
    )
    try:
        # Mid-play, ask for a reboot the way a new driver or kernel does.
        wait_for(
            "the play to start", lambda: node.state().get("stage") == "site", BAKED_S, node=node
        )
        node.sh("touch /run/reboot-required")
        wait_for("the node to reboot", lambda: not node.running(), BAKED_S, node=node)
        before = node.state()
        first_boot = time.monotonic() - node.started
        assert before["stage"] == "reboot" and before["state"] == "running", before
        assert before["reboots"] == 1 and before["reboot_reason"] == "/run/reboot-required", before
        assert not [
            e
            for e in fakes.lifecycle()
            if e["instance"] == node.instance_id and e["call"] == "CompleteLifecycleAction"
        ], "joined the group before its reboot"
        podman("start", node.name)  # the hypervisor boots the machine again
        state = settle(node, BAKED_S)
        seconds = time.monotonic() - node.started
        assert state["state"] == "ready", f"{state}\n{node.journal()[-4000:]}"
        assert state["mode"] == "baked" and not state.get("baked_fallback"), state
        assert state["boots"] == 2 and state["reboots"] == 1, state
        first, resumed = state["plays"]
        assert (
            first["playbook"] == resumed["playbook"] == "baked.yml"
            and first["rc"] == resumed["rc"] == 0
        )
        # Resumed from the top, not started over: nothing was left to change.
        assert resumed["stats"][node.instance_id]["changed"] == 0, resumed
        assert state["lifecycle"] == {LAUNCH: "CONTINUE"}, state
        assert len(_predict(node)["outputs"][0]) == 10
        assert (
            _json_from_node(node, "/etc/torchfleet/image.json")["bundle_sha256"]
            == fakes.bundle.sha256
        )
        print(
            f"\nbaked bootstrap: boot -> baked.yml done {first_boot:.0f} s wall (baked.yml "
            f"{first['seconds']} s, stages {before['stages']}); with a reboot and the resumed play "
            f"({resumed['seconds']} s) -> ready {seconds:.0f} s"
        )
    finally:
        remove(node)


@pytest.mark.legacy
@pytest.mark.skipif(
    not os.environ.get("TORCHFLEET_BOOTSTRAP_LEGACY"),
    reason="opt-in (TORCHFLEET_BOOTSTRAP_LEGACY=1): another cold boot, 10+ minutes here",
)
def test_legacy_node_python39_runs_the_roles_on_ansible_core_215(fakes: Fakes, tmp_path) -> None:
    """Debian 11's Python 3.9 as its own controller: the agent's 3.9 pins (ansible-core 2.15)
    run site.yml with the legacy stack (torch 1.12.1, numpy<2) of the Molecule legacy scenario."""
    image, wheels, torch = (
        node_image_for("bullseye"),
        bootstrap_wheels_for("3.9.2"),
        torch_wheelhouse_for("cp39"),
    )
    gv = tmp_path / "group_vars"
    gv.mkdir()
    (gv / "all.yml").write_text(
        yaml.safe_dump(
            {
                "torchfleet_cloud": "aws",
                "torchfleet_env": "prod",
                "pytorch_wheelhouse": "/opt/wheelhouse",
                "pytorch_wheelhouse_on_node": True,
                "pytorch_torch_version": "1.12.1",
                "pytorch_torchvision_version": "",
                "pytorch_expected_cuda": "10.2",
                "inference_runtime_model_source": "demo",
                "autostop_enabled": False,
                "inference_runtime_ready_retries": 300,
            },
            sort_keys=True,
        )
    )
    facts = {
        "group_vars": {
            "torchfleet_cloud": "aws",
            "torchfleet_env": "prod",
            "torchfleet_cuda_profile": "cu116",
            "torchfleet_gpu_model": "",
            "torchfleet_compute_capability": "",
            "torchfleet_instance_type": INSTANCE_TYPE,
            "torchfleet_spot": False,
        },
        "instance_types": bundle_mod.stack_facts(STACK)["instance_types"],
    }
    legacy = bundle_mod.build(STACK, tmp_path, group_vars=gv, facts=facts)
    fakes.client("s3").upload_file(str(legacy.path), BUNDLES, legacy.key)
    spec = BootstrapSpec(
        **{
            **_spec(fakes, "cold"),
            "bundle_key": legacy.key,
            "bundle_sha256": legacy.sha256,
        }
    )
    node = boot(fakes, image, spec, tmp_path, wheels, torch)
    try:
        state = settle(node, COLD_S)
        assert state["state"] == "ready", f"{state}\n{node.journal()[-4000:]}"
        version = node.sh(f"{playbook.VENV}/bin/ansible --version | head -1")
        assert "core 2.15.13" in version, version
        assert len(_predict(node)["outputs"][0]) == 10
        print(
            f"\nlegacy cold bootstrap (Debian 11, Python 3.9, ansible-core 2.15): ready in "
            f"{time.monotonic() - node.started:.0f} s (site.yml {state['plays'][0]['seconds']} s)"
        )
    finally:
        remove(node)
