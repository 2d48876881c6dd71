"""The provision stage fed with RECORDED engine events and outputs of an aws-dev `pulumi up`
(tests/deploy/fixtures, made by record_engine_events.py from the mock-engine run): what it
prints, what it hands to the next stage (the inventory file), and how a failed update is
reported. The events go through pulumi.automation's own EngineEvent.from_json, as the
Automation API delivers them to `on_event`."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import yaml
from pulumi import automation as auto
from pulumi.automation import CommandResult, EngineEvent, OutputValue

from infra.deploy import automation, inventory
from infra.deploy.stage import StageError
from infra.matrix import REPO_ROOT
from infra.offline import run_offline
from infra.plan import load_stack_config


class RecordedStack:
    """A stack whose `up` replays recorded engine events, then returns the recorded outputs
    (or raises what the CLI raised)."""

    def __init__(self, events, outputs=None, error: Exception | None = None):
        self.events, self.outputs_, self.error = events, outputs, error
        self.calls: list[str] = []
        self.workspace = SimpleNamespace(env_vars={})  # the program's environment

    def up(self, on_event=None, on_output=None, **kwargs):
        self.calls.append("up")
        for raw in self.events:
            on_event(EngineEvent.from_json(raw))
        on_output("Updating (aws-dev)\n")
        if self.error:
            raise self.error
        return auto.UpResult(
            stdout="",
            stderr="",
            summary=None,
            outputs={k: OutputValue(v["value"], v["secret"]) for k, v in self.outputs_.items()},
        )

    def destroy(self, on_event=None, on_output=None, **kwargs):
        self.calls.append("destroy")
        return None


def test_recorded_up_becomes_outputs_and_a_stack_shaped_inventory(
    recorded, console, text, tmp_path
):
    events = recorded("aws-dev.up.events.json")
    stack = RecordedStack(events, recorded("aws-dev.up.outputs.json"))
    out = automation.up("aws-dev", console, opener=lambda name: stack)
    assert stack.calls == ["up"]
    assert set(out.values) >= {"inventory", "endpoint", "cost", "ttl_expiry"}
    assert out.secret_keys == {"api_token"}  # the stack's API token, never shown
    assert out.masked()["api_token"] == automation.SECRET

    path = inventory.write("aws-dev", inventory.inventory_of(out.values), tmp_path)
    written = yaml.safe_load(path.read_text())
    assert written == out.values["inventory"]
    host = written["all"]["children"]["gpu_nodes"]["hosts"]["aws-dev-gpu-0"]
    assert host["ansible_host"] == host["public_ip"] and host["torchfleet_gpu_model"] == "L4"
    assert out.values["endpoint"] == f"http://{host['private_ip']}:8080"
    assert [p.name for p in path.parent.iterdir()] == ["stack.yml"]  # no temp file left over

    shown = text(console)
    creates = [e for e in events if "resOutputsEvent" in e]
    for e in creates:
        meta = e["resOutputsEvent"]["metadata"]
        if meta["type"] != "pulumi:pulumi:Stack":
            assert f"created  {meta['type']}  {meta['urn'].rsplit('::', 1)[1]}" in shown
    assert "pulumi:pulumi:Stack" not in shown
    assert f"{len(creates)} created in 1 min 34 s" in shown
    assert "Updating (aws-dev)" not in shown  # the CLI's own text goes to the run log only


def test_recorded_failure_names_the_resource_and_the_providers_error(recorded, console, text):
    failed = RecordedStack(
        recorded("aws-dev.up-failed.events.json"),
        error=auto.CommandError(CommandResult(stdout="", stderr="error: update failed", code=255)),
    )
    with pytest.raises(StageError) as info:
        automation.up("aws-dev", console, opener=lambda name: failed)
    err = info.value
    assert err.stage == "provision" and err.exit_code == 4
    assert "aws:ec2/instance:Instance fleet-node-0" in err.message
    assert err.task == "fleet-node-0"
    assert any("InsufficientInstanceCapacity" in d for d in err.details)
    assert "re-run" in err.fix
    shown = text(console)
    assert "!! failed   aws:ec2/instance:Instance  fleet-node-0" in shown
    assert "error  fleet-node-0: creating EC2 Instance" in shown
    rendered = "\n".join(err.render())
    assert rendered.startswith("FAILED at stage provision (task 'fleet-node-0')")


def test_a_concurrent_update_says_how_to_recover(console):
    busy = RecordedStack(
        [],
        error=auto.ConcurrentUpdateError(
            CommandResult(
                stdout="",
                stderr="error: [409] Conflict: Another update is currently in progress.",
                code=255,
            )
        ),
    )
    with pytest.raises(StageError) as info:
        automation.up("aws-dev", console, opener=lambda name: busy)
    assert "in progress" in info.value.message and "pulumi cancel -s aws-dev" in info.value.fix


def test_recorded_outputs_still_have_the_programs_shape(recorded, monkeypatch):
    """The fixture must not drift from infra/: same output names, same per-host variables."""
    monkeypatch.setenv("TORCHFLEET_NOW", "2026-03-02T10:17:00Z")
    today = run_offline("aws-dev", load_stack_config("aws-dev")).outputs
    saved = recorded("aws-dev.up.outputs.json")
    assert set(saved) <= set(today), "re-run tests/deploy/record_engine_events.py"

    def host_keys(outputs):
        hosts = outputs["inventory"]["all"]["children"]["gpu_nodes"]["hosts"]
        return {name: sorted(h) for name, h in hosts.items()}

    assert host_keys({k: v["value"] for k, v in saved.items()}) == host_keys(today)


def test_inventory_write_is_atomic(tmp_path, recorded, monkeypatch):
    inv = recorded("aws-dev.up.outputs.json")["inventory"]["value"]
    path = inventory.write("aws-dev", inv, tmp_path)
    before = path.read_text()
    changed = {
        "all": {
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        "other": {**inv["all"]["children"]["gpu_nodes"]["hosts"]["aws-dev-gpu-0"]}
                    }
                }
            }
        }
    }

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        inventory.write("aws-dev", changed, tmp_path)
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir()] == ["stack.yml"]


def test_outputs_that_are_not_an_inventory_stop_the_inventory_stage():
    with pytest.raises(inventory.InventoryError, match="no `inventory`"):
        inventory.inventory_of({"endpoint": "http://x"})
    bad = {
        "inventory": {"all": {"children": {"gpu_nodes": {"hosts": {"n": {"ansible_host": "a"}}}}}}
    }
    with pytest.raises(inventory.InventoryError, match="host n lacks torchfleet_cloud"):
        inventory.inventory_of(bad)


def test_up_turns_recorded_events_into_the_inventory_the_converge_stage_reads(
    fake_pulumi, ssh_key, aws_keys, stack_with, trap_dirs, recorded, monkeypatch, capsys
):
    """`torchfleet up aws-dev` end to end up to the converge stage: preflight passes, the
    provision stage replays the recording, the inventory stage writes stack.yml, and the converge
    stage receives exactly that inventory (then stops: there is no node behind 203.0.113.x)."""
    from infra import cli
    from infra.deploy import converge

    stack_with("aws-dev", ssh_public_key=ssh_key[1])
    stack = RecordedStack(recorded("aws-dev.up.events.json"), recorded("aws-dev.up.outputs.json"))
    monkeypatch.setattr(automation, "open_stack", lambda name: stack)
    seen = {}

    def converge_stops_here(inventory_dir):
        seen["inventory"] = yaml.safe_load((inventory_dir / "stack.yml").read_text())
        raise StageError(
            "converge",
            "stopped by the test",
            host="aws-dev-gpu-0",
            task="site.yml: Gathering Facts",
        )

    monkeypatch.setattr(converge, "hostvars", converge_stops_here)
    rc = cli.main(["up", "aws-dev"])
    out = capsys.readouterr().out
    assert rc == 6, out
    assert stack.calls == ["up"]
    assert seen["inventory"] == recorded("aws-dev.up.outputs.json")["inventory"]["value"]
    assert "wrote " in out and "aws-dev-gpu-0 (203.0.113." in out
    assert "[3/6] inventory" in out and "[4/6] converge" in out
    # the stack tag activated for `torchfleet cost` (the autouse fake Cost Explorer answered)
    assert "cost allocation tag `stack` active" in out
    assert "FAILED at stage converge (host aws-dev-gpu-0, task 'site.yml: Gathering Facts')" in out
    run = next((trap_dirs / "runs" / "aws-dev").iterdir())
    assert set(json.loads((run / "outputs.json").read_text())) >= {"inventory", "cost"}
    assert "created  aws:ec2/instance:Instance  fleet-node-0" in (run / "up.log").read_text()
    assert calls_of(fake_pulumi) == ["version", "whoami --json"]  # the rest was the recording


def calls_of(log):
    return log.read_text().splitlines()


def test_the_automation_api_drives_the_cli_on_this_repositorys_project(
    fake_pulumi, console, monkeypatch
):
    """The real Automation API (no recording): it selects the stack and runs `pulumi up` with the
    repository root as the project; the CLI's refusal becomes a provision-stage error."""
    monkeypatch.setenv("FAKE_PULUMI_BACKEND", "1")
    with pytest.raises(StageError) as info:
        automation.up("aws-dev", console)
    err = info.value
    assert (err.stage, err.exit_code) == ("provision", 4)
    assert any("InvalidClientTokenId" in d for d in err.details)
    ran = calls_of(fake_pulumi)
    assert ran[:2] == ["version", "--non-interactive stack select --stack aws-dev"]
    assert ran[2].startswith("--non-interactive up --yes --skip-preview")
    assert ran[2].endswith("--stack aws-dev") and "--event-log tcp://127.0.0.1:" in ran[2]
    assert (fake_pulumi.parent / (fake_pulumi.name + ".cwd")).read_text().strip() == str(REPO_ROOT)
