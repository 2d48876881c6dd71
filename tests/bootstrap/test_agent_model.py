"""The node agent hands a rollout track's model to Ansible: the node config's `model` (the
candidate group's nodes, or the stable group's after a promotion) becomes the extra vars
inference_runtime_model_source / _checksum in node-vars.json, which `ansible-playbook -e @...`
makes win over the bundle's group vars; without it the extra vars name no model (the group
vars' model). And the spec that renders the node config checks the override's shape."""

from __future__ import annotations

import collections.abc
import json
import subprocess
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import bundle
from infra.bootstrap import BootstrapError, BootstrapSpec, render_user_data
from infra.bootstrap.torchfleet_agent import boot, inventory, playbook
from infra.bootstrap.torchfleet_agent.cloud import cloud_of
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


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON value is of a NodeConfig annotation's type (str, int, bool, X | None,
    a mapping or a list of them)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in args)
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, dict) and all(
            _conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items()
        )
    if origin in (list, collections.abc.Sequence):
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if hint is type(None):
        return value is None
    return type(value) is hint  # bool is not int, int is not bool


def test_the_agent_reads_the_node_json_the_bundle_side_writes(tmp_path, monkeypatch) -> None:
    """node.json from end to end: a group node's spec rendered into user-data as a stack's nodes
    get it, its node.json written where cloud-init puts it, read by the agent's own loader, every
    value of the type NodeConfig declares, and acted on by the agent (its cloud, the port and
    the model it hands Ansible)."""
    spec = _spec(
        group_name="torchfleet-aws-prod-candidate-asg",
        launch_hook="torchfleet-launch",
        service_port=9090,
        endpoints={"s3": "http://127.0.0.1:1"},
        pip_args=("--no-index",),
        model=MODEL,
    )
    written = yaml.safe_load(render_user_data(spec))["write_files"]
    (node_json,) = [f["content"] for f in written if f["path"] == boot.CONFIG]
    config = tmp_path / "node.json"
    config.write_text(node_json)
    monkeypatch.setattr(boot, "CONFIG", str(config))
    cfg = boot.load_config()
    assert cfg is not None
    hints = typing.get_type_hints(boot.NodeConfig)
    assert set(cfg) == set(hints)
    wrong = {k: v for k, v in cfg.items() if not _conforms(v, hints[k])}
    assert not wrong, f"node.json values not of NodeConfig's types: {wrong}"
    picked = ("group_name", "service_port", "pip_args", "model")
    assert {k: v for k, v in cfg.items() if k in picked} == {
        "group_name": "torchfleet-aws-prod-candidate-asg",
        "service_port": 9090,
        "pip_args": ["--no-index"],
        "model": MODEL,
    }
    assert type(cloud_of(cfg)).__name__ == "Aws"
    inventory.write_inventory(cfg, IDENT, str(_tree(tmp_path, monkeypatch)))
    node_vars = _node_vars(tmp_path)
    assert node_vars["inference_runtime_port"] == 9090
    assert node_vars["inference_runtime_spot_watch"] == "off"
    assert node_vars["inference_runtime_model_source"] == MODEL["source"]
