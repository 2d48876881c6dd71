"""The node agent hands a rollout track's model to Ansible: the node config's `model` (the
candidate group's nodes, or the stable group's after a promotion) becomes the extra vars
inference_runtime_model_source / _checksum in node-vars.json, which `ansible-playbook -e @...`
makes win over the bundle's group vars; without it the extra vars name no model (the group
vars' model). And the spec that renders the node config checks the override's shape."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra import bundle
from infra.bootstrap import BootstrapError, BootstrapSpec, render_user_data
from infra.bootstrap.torchfleet_agent import boot, inventory, playbook
from infra.bootstrap.torchfleet_agent.state import State

STACK = "aws-prod"
MODEL = {
    "source": "s3://models-bucket/models/" + "c" * 64 + ".pt",
    "checksum": "sha256:" + "c" * 64,
}


def _tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(boot, "WORK", str(tmp_path / "work"))
    tree = tmp_path / "bundle"
    (tree / "inventories" / STACK / "group_vars").mkdir(parents=True)
    (tree / "node.json").write_text(json.dumps(bundle.stack_facts(STACK)))
    manifest = {"stack": STACK, "runtime_wheel": "w.whl", "compat_wheel": "c.whl"}
    (tree / "manifest.json").write_text(json.dumps(manifest))
    return tree


def _node_vars(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "work" / "node-vars.json").read_text())


IDENT = {"instance_id": "i-0abc", "instance_type": "g5.xlarge", "spot": True}


def test_the_override_reaches_ansible_as_extra_vars(tmp_path, monkeypatch) -> None:
    tree = _tree(tmp_path, monkeypatch)
    cfg = {"service_port": 8080, "group_name": "torchfleet-aws-prod-candidate-asg", "model": MODEL}
    hosts = inventory.write_inventory(cfg, IDENT, str(tree))  # type: ignore[arg-type]
    node_vars = _node_vars(tmp_path)
    assert node_vars["inference_runtime_model_source"] == MODEL["source"]
    assert node_vars["inference_runtime_model_checksum"] == MODEL["checksum"]
    # the play gets them as extra vars (they win over the inventory's group vars)
    calls: list[list[str]] = []

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(boot, "run", run)
    monkeypatch.setattr(boot, "STATE", str(tmp_path / "state.json"))
    monkeypatch.setattr(boot, "log", lambda line: None)
    state = State()
    playbook.run(str(tree), hosts, "site.yml", state)
    (argv,) = calls
    i = argv.index("-e")
    assert argv[i + 1] == f"@{tmp_path / 'work' / 'node-vars.json'}"
    assert argv[argv.index("-i") + 1] == hosts


def test_without_an_override_the_group_vars_model_stands(tmp_path, monkeypatch) -> None:
    tree = _tree(tmp_path, monkeypatch)
    inventory.write_inventory({"service_port": 8080}, IDENT, str(tree))  # type: ignore[arg-type]
    assert not [k for k in _node_vars(tmp_path) if "model" in k]


def _spec(**kw: Any) -> BootstrapSpec:
    return BootstrapSpec(
        cloud="aws",
        region="us-east-1",
        stack=STACK,
        bundle_bucket="b",
        bundle_key="bundles/aws-prod/x.tar.gz",
        bundle_sha256="0" * 64,
        **kw,
    )


def test_the_node_config_carries_the_override_only_when_given() -> None:
    assert '"model"' not in render_user_data(_spec())
    assert MODEL["source"] in render_user_data(_spec(model=MODEL))


@pytest.mark.parametrize(
    ("model", "names"),
    [
        ({"source": "https://x/m.pt", "checksum": MODEL["checksum"]}, "model.source"),
        ({"source": MODEL["source"], "checksum": "md5:abc"}, "model.checksum"),
        ({"source": MODEL["source"]}, "model"),
    ],
)
def test_a_bad_override_is_refused_naming_the_field(model: dict, names: str) -> None:
    with pytest.raises(BootstrapError) as err:
        render_user_data(_spec(model=model))
    assert names in str(err.value)
