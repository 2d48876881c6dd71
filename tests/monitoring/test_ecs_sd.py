"""The monitoring role's ECS discovery (Alibaba group stacks): the service and timer as Ansible
renders them from the role's defaults for a group stack's inventory, then the service's own
command line run as a process from the folder the role installs (the listing,
roles/monitoring/files/torchfleet_ecs_sd.py = infra/ecs_listing.py, beside the role's filter
plugin) against the loopback fake that checks every ACS3 signature
(tests/bootstrap/fake_alibaba.py), answering ECS DescribeInstances for the stack's tags:
- the file_sd lists hold the running nodes with the labels of every discovery mode
  (torchfleet_file_sd), on both jobs' ports;
- a listing that fails (a refused signature) keeps the last lists and exits 1;
- the role's SDK pins are the controller's.
The timer converging on the monitoring host is not exercised here (the monitoring Molecule
scenario is a `local` stack: file discovery)."""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "monitoring"
sys.path.insert(0, str(ROOT / "tests" / "bootstrap"))
sys.path.insert(0, str(ROOT / "tests" / "roles"))
import role_render  # noqa: E402
from fake_alibaba import FakeAlibaba  # noqa: E402

TAGS = {"torchfleet-role": "gpu-node", "stack": "alicloud-prod"}
DISCOVERY = {
    "cloud": "alicloud",
    "region": "cn-shanghai",
    "scaling_group_name": "torchfleet-alicloud-prod-ess",
    "tags": TAGS,
}
KEYS = {"ALIBABA_CLOUD_ACCESS_KEY_ID": "operator", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "s3cret"}
NODES = [  # (id, private ip, spot, type)
    ("i-stable1", "10.42.0.11", False, "ecs.gn7i-c8g1.2xlarge"),
    ("i-stable2", "10.42.16.12", True, "ecs.gn7i-c8g1.2xlarge"),
    ("i-cand1", "10.42.0.13", True, "ecs.gn6i-c4g1.xlarge"),
]


def describe_instances(seen: list[dict[str, str]]):
    def answer(action: str, params: dict[str, str]) -> dict[str, Any]:
        assert action == "DescribeInstances", action
        seen.append(params)
        tags = {params[f"Tag.{n}.Key"]: params[f"Tag.{n}.Value"] for n in (1, 2)}
        assert tags == TAGS and params["Status"] == "Running", params
        return {
            "TotalCount": len(NODES),
            "Instances": {
                "Instance": [
                    {
                        "InstanceId": i,
                        "InstanceType": kind,
                        "ZoneId": "cn-shanghai-l",
                        "SpotStrategy": "SpotWithPriceLimit" if spot else "NoSpot",
                        "PublicIpAddress": {"IpAddress": []},
                        "VpcAttributes": {"PrivateIpAddress": {"IpAddress": [ip]}},
                    }
                    for i, ip, spot, kind in NODES
                ]
            },
        }

    return answer


def render(tmp_path: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """The units and the chosen discovery mode, as the role's defaults give them."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), NO_COLOR="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    texts = role_render.render(
        tmp_path,
        [ROLE / "defaults" / "main.yml"],
        {
            "service": role_render.template(ROLE / "templates" / "torchfleet-ecs-sd.service.j2"),
            "timer": role_render.template(ROLE / "templates" / "torchfleet-ecs-sd.timer.j2"),
            "discovery": "{{ monitoring_discovery }}",
        },
        extra,
        env,
    )
    out: dict[str, Any] = {"discovery": texts["discovery"].strip()}
    for kind in ("service", "timer"):
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.read_string(texts[kind])
        out[kind] = parser
    return out


def installed(tmp_path: Path) -> Path:
    """/opt/torchfleet-ecs-sd as tasks/ecs_sd.yml lays it out."""
    opt = tmp_path / "opt"
    opt.mkdir()
    shutil.copyfile(ROLE / "files" / "torchfleet_ecs_sd.py", opt / "torchfleet_ecs_sd.py")
    shutil.copyfile(
        ROLE / "filter_plugins" / "torchfleet_monitoring.py", opt / "torchfleet_monitoring.py"
    )
    return opt


def run(units: dict[str, Any], tmp_path: Path, sd_dir: Path) -> subprocess.CompletedProcess[str]:
    """The service's command, as installed under tmp_path, with the operator's keys (the
    host's RAM role's come through the same default chain)."""
    return subprocess.run(
        command(units, installed(tmp_path), sd_dir),
        env={**os.environ, **KEYS, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def command(units: dict[str, Any], opt: Path, sd_dir: Path) -> list[str]:
    """The service's ExecStart, run from `opt` with this venv's Python, writing to `sd_dir`."""
    argv = shlex.split(units["service"]["Service"]["ExecStart"])
    assert argv[:2] == [
        "/opt/torchfleet-ecs-sd/venv/bin/python",
        "/opt/torchfleet-ecs-sd/torchfleet_ecs_sd.py",
    ]
    assert argv[argv.index("--dir") + 1] == "/etc/prometheus/file_sd"
    argv[argv.index("--dir") + 1] = str(sd_dir)
    return [sys.executable, str(opt / "torchfleet_ecs_sd.py"), *argv[2:]]


def test_a_group_stacks_nodes_become_file_sd_lists(tmp_path: Path) -> None:
    from monitoring_support import load_filters

    seen: list[dict[str, str]] = []
    with FakeAlibaba(
        describe_instances(seen), access_key="operator", secret="s3cret", token=None
    ) as ecs:
        units = render(
            tmp_path,
            {
                "torchfleet_cloud": "alicloud",
                "torchfleet_env": "prod",
                "torchfleet_discovery": DISCOVERY,
                "monitoring_ecs_endpoint": ecs.url,
            },
        )
        assert units["discovery"] == "ecs"  # the default for an Alibaba group stack
        timer = units["timer"]["Timer"]
        assert (timer["OnUnitActiveSec"], timer["OnBootSec"]) == ("30s", "10s")
        service = units["service"]["Service"]
        assert (
            service["User"] == "prometheus"
            and service["ReadWritePaths"] == "/etc/prometheus/file_sd"
        )
        assert (
            service["Environment"]
            == "ALIBABA_CLOUD_ECS_METADATA=torchfleet-alicloud-prod-monitoring"
        )
        sd = tmp_path / "file_sd"
        sd.mkdir()
        done = run(units, tmp_path, sd)
        assert done.returncode == 0, done.stderr
        assert ecs.refused == [] and len(seen) == 1
    assert "3 node(s) of alicloud-prod" in done.stderr
    nodes = [
        {
            "node": i,
            "address": ip,
            "stack": "alicloud-prod",
            "cloud": "alicloud",
            "instance_type": kind,
            "lifecycle": "spot" if spot else "on-demand",
        }
        for i, ip, spot, kind in NODES
    ]
    filters = load_filters()
    for job, port in (("torchfleet-runtime", 8080), ("torchfleet-node", 9100)):
        got = json.loads((sd / f"{job}.json").read_text())
        assert got == filters.torchfleet_file_sd(nodes, port)
        assert got[2] == {
            "targets": [f"10.42.0.13:{port}"],
            "labels": {
                "stack": "alicloud-prod",
                "node": "i-cand1",
                "cloud": "alicloud",
                "instance_type": "ecs.gn6i-c4g1.xlarge",
                "lifecycle": "spot",
            },
        }
    assert sorted(p.name for p in sd.iterdir()) == [
        "torchfleet-node.json",
        "torchfleet-runtime.json",
    ]


def test_a_failed_listing_keeps_the_last_lists(tmp_path: Path) -> None:
    with FakeAlibaba(
        describe_instances([]), access_key="operator", secret="other", token=None
    ) as ecs:
        units = render(
            tmp_path,
            {
                "torchfleet_cloud": "alicloud",
                "torchfleet_discovery": DISCOVERY,
                "monitoring_ecs_endpoint": ecs.url,
            },
        )
        sd = tmp_path / "file_sd"
        sd.mkdir()
        last = '[{"targets": ["10.42.0.11:8080"], "labels": {"node": "i-stable1"}}]\n'
        (sd / "torchfleet-runtime.json").write_text(last)
        done = run(units, tmp_path, sd)
        assert ecs.refused  # the secret is not the account's
    assert done.returncode == 1
    assert "listing the nodes failed, the last lists stay" in done.stderr
    assert "SignatureDoesNotMatch" in done.stderr
    assert (sd / "torchfleet-runtime.json").read_text() == last
    assert not (sd / "torchfleet-node.json").exists()


@pytest.mark.parametrize(
    ("extra", "discovery"),
    [
        ({"torchfleet_cloud": "alicloud"}, "file"),  # no group: the inventory's hosts
        ({"torchfleet_cloud": "aws", "torchfleet_discovery": DISCOVERY}, "ec2"),
    ],
)
def test_other_stacks_keep_their_discovery(tmp_path: Path, extra: dict, discovery: str) -> None:
    assert render(tmp_path, extra)["discovery"] == discovery


def test_the_roles_sdk_pins_are_the_controllers() -> None:
    pins = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split(";")[0].strip().split("==")
            pins[name.lower().replace("_", "-")] = version
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for line in defaults["monitoring_ecs_packages"]:
        name, version = line.split("==")
        assert pins[name.lower()] == version, line
    assert (ROLE / "files" / "torchfleet_ecs_sd.py").resolve() == ROOT / "infra" / "ecs_listing.py"
