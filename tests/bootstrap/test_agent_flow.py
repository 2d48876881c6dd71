"""The node agent's state machine, in process, with its file locations in a temporary directory
and the cloud, Ansible and systemd replaced by recorders: the paths a container cannot cheaply
take (a warm pool, a failing task, a baked image whose bundle moved on, a bake for an image
builder, a state file left by an image's builder). The real thing runs in
test_node_bootstrap.py; the stub's part in test_agent.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from infra.bootstrap.torchfleet_agent import (
    boot,
    bootstrap,
    image,
    inventory,
    lifecycle,
    playbook,
    state,
)

MODULES: list[ModuleType] = [boot, bootstrap, image, inventory, lifecycle, playbook, state]

SHA = "ab" * 32


class FakeCloud:
    def __init__(self, target: str | None = "InService") -> None:
        self.target, self.calls = target, []

    def identity(self) -> dict[str, Any]:
        return {
            "instance_id": "i-1",
            "region": "us-east-1",
            "instance_type": "g5.xlarge",
            "spot": True,
            "target": self.target,
        }

    def lifecycle(self, hook: str, result: str, instance_id: str) -> None:
        self.calls.append((hook, result, instance_id))

    def heartbeat(self, hook: str, instance_id: str) -> None:
        self.calls.append((hook, "heartbeat", instance_id))


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A group node whose stub has made the bootstrap venv and unpacked the bundle: the agent's
    plays, cloud calls and systemctl recorded."""
    cfg = {
        "cloud": "alicloud",
        "region": "us-east-1",
        "stack": "aws-prod",
        "bundle_bucket": "b",
        "bundle_key": "k",
        "bundle_sha256": SHA,
        "mode": "cold",
        "group_name": "g",
        "launch_hook": "torchfleet-launch",
        "terminate_hook": "torchfleet-terminate",
        "service_port": 8080,
    }
    # Every path the agent knows moves under tmp_path: this process is root on a real machine.
    for module in MODULES:
        for name, value in vars(module).items():
            if isinstance(value, str) and value.startswith("/"):
                monkeypatch.setattr(module, name, str(tmp_path / value.lstrip("/")))
            elif (
                isinstance(value, tuple)
                and value
                and all(isinstance(v, str) and v.startswith("/") for v in value)
            ):
                moved = tuple(str(tmp_path / v.lstrip("/")) for v in value)
                monkeypatch.setattr(module, name, moved)
    paths = {name: Path(getattr(boot, name)) for name in ("CONFIG", "STATE", "WORK")}
    paths["IMAGE_RECORD"] = Path(image.IMAGE_RECORD)
    for path in [*image.MACHINE_IDS, bootstrap.CLOUD_INSTANCE_ID]:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    for path in image.MACHINE_IDS:
        Path(path).write_text("0123456789abcdef0123456789abcdef\n")
    paths["CONFIG"].parent.mkdir(parents=True)
    paths["CONFIG"].write_text(json.dumps(cfg))
    world: dict[str, Any] = {
        "cloud": FakeCloud(),
        "plays": [],
        "fail": {},
        "systemctl": [],
        "cfg": cfg,
        "paths": paths,
        "reboot": None,
    }
    monkeypatch.setattr(bootstrap, "cloud_of", lambda _cfg: world["cloud"])
    monkeypatch.setattr(playbook, "ensure_venv", lambda cfg: None)
    monkeypatch.setattr(inventory, "write_inventory", lambda cfg, ident, tree: "/inventory")
    monkeypatch.setattr(lifecycle, "wait_ready", lambda cfg, timeout=900: None)
    monkeypatch.setattr(playbook, "reboot_pending", lambda: world["reboot"])

    def play(tree: str, hosts: str, name: str, _state: state.State) -> None:
        assert tree == boot.bundle_tree(SHA)  # the bundle the stub verified and unpacked
        world["plays"].append(name)
        if name in world["fail"]:
            raise boot.Failure(
                "site",
                f"{name} failed at task '{world['fail'][name]}': boom",
                task=world["fail"][name],
            )

    monkeypatch.setattr(playbook, "run", play)
    monkeypatch.setattr(boot, "run", lambda argv, **kw: world["systemctl"].append(argv))
    return world


def one_boot(world: dict[str, Any]) -> dict[str, Any]:
    """One boot's run of the bootstrap unit."""
    rc = bootstrap.bootstrap([])
    return {"rc": rc, **json.loads(world["paths"]["STATE"].read_text())}


def test_cold_node_joins_and_a_ready_node_stays_ready(node: dict[str, Any]) -> None:
    done = one_boot(node)
    assert done["rc"] == 0 and done["state"] == "ready" and node["plays"] == ["site.yml"]
    assert node["cloud"].calls == [("torchfleet-launch", "CONTINUE", "i-1")]
    assert ["systemctl", "start", *image.WATCHERS] in node["systemctl"]
    again = one_boot(node)  # the unit runs on every boot: a ready node changes nothing
    assert again["rc"] == 0 and node["plays"] == ["site.yml"] and len(node["cloud"].calls) == 1


def test_a_failed_task_is_named_and_the_launch_abandoned(node: dict[str, Any]) -> None:
    node["fail"] = {"site.yml": "pytorch : Install torch==2.13.0"}
    done = one_boot(node)
    assert done["rc"] == 1 and done["state"] == "failed" and done["stage"] == "site"
    assert done["failed_task"] == "pytorch : Install torch==2.13.0" and "boom" in done["error"]
    assert node["cloud"].calls == [("torchfleet-launch", "ABANDON", "i-1")]
    assert done["lifecycle"] == {"torchfleet-launch": "ABANDON"}


def test_a_reboot_request_reboots_before_joining_and_is_bounded(node: dict[str, Any]) -> None:
    node["reboot"] = "the NVIDIA driver is installed but not loaded"
    for n in (1, 2):
        done = one_boot(node)
        assert done["state"] == "running" and done["stage"] == "reboot" and done["reboots"] == n
        assert ["systemctl", "reboot"] in node["systemctl"] and node["cloud"].calls == []
    done = one_boot(node)  # a third request: no endless reboots, join (or fail) on what it has
    assert done["state"] == "ready" and done["boots"] == 3 and node["plays"] == ["site.yml"] * 3


def test_a_new_driver_that_stops_the_play_reboots_and_resumes(node: dict[str, Any]) -> None:
    # The nvidia_driver role fails a local play once the driver is in but not loaded.
    node["fail"] = {"site.yml": "nvidia_driver : refuse a local reboot"}
    node["reboot"] = "the NVIDIA driver is installed but not loaded"
    rebooted = one_boot(node)
    assert (
        rebooted["state"] == "running"
        and rebooted["stage"] == "reboot"
        and rebooted["reboots"] == 1
    )
    assert node["cloud"].calls == [] and ["systemctl", "reboot"] in node["systemctl"]
    node["fail"], node["reboot"] = {}, None  # after the reboot the driver is loaded
    done = one_boot(node)
    assert (
        done["state"] == "ready"
        and done["boots"] == 2
        and node["plays"] == ["site.yml", "site.yml"]
    )
    assert node["cloud"].calls == [("torchfleet-launch", "CONTINUE", "i-1")]


def test_a_failing_play_with_no_reboot_left_fails(node: dict[str, Any]) -> None:
    node["fail"] = {"site.yml": "nvidia_driver : refuse a local reboot"}
    node["reboot"] = "the NVIDIA driver is installed but not loaded"
    for _ in range(bootstrap.MAX_REBOOTS):
        assert one_boot(node)["stage"] == "reboot"
    done = one_boot(node)
    assert (
        done["state"] == "failed" and done["failed_task"] == "nvidia_driver : refuse a local reboot"
    )
    assert node["cloud"].calls == [("torchfleet-launch", "ABANDON", "i-1")]


def test_warm_pool_node_waits_warmed_then_joins_from_the_baked_path(node: dict[str, Any]) -> None:
    node["cloud"].target = "Warmed:Stopped"
    warmed = one_boot(node)
    assert warmed["state"] == "warmed" and node["plays"] == ["site.yml"]
    assert node["cloud"].calls == [
        ("torchfleet-launch", "CONTINUE", "i-1")
    ]  # the group may stop it
    node["cloud"].target = "InService"  # started from the pool
    ready = one_boot(node)
    assert (
        ready["state"] == "ready"
        and ready["mode"] == "baked"
        and node["plays"] == ["site.yml", "baked.yml"]
    )
    assert node["cloud"].calls[-1] == ("torchfleet-launch", "CONTINUE", "i-1")


def test_a_baked_image_older_than_its_bundle_falls_back_to_site(node: dict[str, Any]) -> None:
    node["cfg"]["mode"] = "baked"
    node["paths"]["CONFIG"].write_text(json.dumps(node["cfg"]))
    node["fail"] = {"baked.yml": "pytorch : Verify torch's CUDA build, GPU access and numpy bridge"}
    done = one_boot(node)
    assert done["state"] == "ready" and node["plays"] == ["baked.yml", "site.yml"]
    assert done["baked_fallback"] == node["fail"]["baked.yml"]


def test_bake_for_an_image_builder_ends_ready_without_identity(node: dict[str, Any]) -> None:
    node["cfg"].update(mode="bake", poweroff=False)
    node["paths"]["CONFIG"].write_text(json.dumps(node["cfg"]))
    done = one_boot(node)
    assert done["rc"] == 0 and done["state"] == "ready" and done["stage"] == "baked"
    assert "identity" not in done and node["cloud"].calls == []  # a builder joins no group
    assert json.loads(node["paths"]["IMAGE_RECORD"].read_text())["bundle_sha256"] == SHA
    assert ["systemctl", "poweroff"] not in node["systemctl"]
    assert not node["paths"]["CONFIG"].exists()
    assert all(Path(p).read_text() == "" for p in image.MACHINE_IDS)  # a new one per instance


def test_a_state_file_from_another_machine_is_not_this_nodes(node: dict[str, Any]) -> None:
    one_boot(node)
    assert bootstrap.this_machine(state.State())  # no cloud-init record: trusted
    Path(bootstrap.CLOUD_INSTANCE_ID).write_text("i-1\n")
    assert bootstrap.this_machine(state.State())
    Path(bootstrap.CLOUD_INSTANCE_ID).write_text("i-other\n")  # an image's builder wrote this state
    assert not bootstrap.this_machine(state.State())
