"""The demo's description of its fleet for `torchfleet rollout` (infra/deploy/demo.py), without
a container: where it goes per container prefix, what it names, and that `demo --clean` removes
only the demo's own (the e2e test, tests/e2e/test_demo.py, rolls out on it for real)."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path

import pytest

from infra.deploy import balancer, containers, demo
from infra.deploy.progress import Console
from infra.deploy.stage import StageError
from infra.rollout.local import FLEET_FILE, LocalFleet

PREFIX = "torchfleet-demo-unit-"


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(demo, "DEMO_ROOT", tmp_path / "demo")
    monkeypatch.setattr(demo, "FLEETS", tmp_path / "fleet")
    return tmp_path


def _nodes(count: int) -> list[containers.ContainerNode]:
    return [
        containers.ContainerNode(f"{PREFIX}node-{i}", f"10.88.0.{i}", 2200 + i, 8100 + i, True)
        for i in range(count)
    ]


def _fleet(prefix: str, nodes: list[containers.ContainerNode], served: bool = True) -> LocalFleet:
    state = demo.state_dir(prefix)
    state.mkdir(parents=True, exist_ok=True)
    for n in nodes:
        if served:
            model = state / "models" / n.name / demo.MODEL_FILE
            model.parent.mkdir(parents=True)
            model.write_bytes(b"model")
    lb = balancer.Balancer(
        state / "balancer",
        [],
        balancer.Certificates(state / "ca.pem", state / "haproxy.pem"),
        https_port=8443,
    )
    return demo.describe_fleet(prefix, lb, nodes, demo.client.Auth(token="t" * 24))


def test_the_default_demo_is_where_the_command_looks_another_prefix_in_its_state(roots):
    assert demo.fleet_dir(containers.PREFIX) == roots / "fleet" / demo.SHAPE_STACK
    assert demo.fleet_dir(PREFIX) == demo.state_dir(PREFIX) / "fleet"


def test_the_description_names_each_nodes_files_here_and_the_admin_token_file(roots):
    nodes = _nodes(3)
    _fleet(PREFIX, nodes)
    path = demo.fleet_dir(PREFIX) / FLEET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = LocalFleet.load(path.parent)
    assert loaded.urls() == {n.name: f"http://127.0.0.1:{n.service_port}" for n in nodes}
    doc = json.loads(path.read_text())
    state = demo.state_dir(PREFIX)
    for n, row in zip(nodes, doc["nodes"], strict=True):
        assert row["model"] == str(state / "models" / n.name / demo.MODEL_FILE)
        assert Path(row["shadow"]).parent == Path(row["model"]).parent
    admin = loaded.admin_token_file
    assert admin == state / "admin-token" and stat.S_IMODE(admin.stat().st_mode) == 0o600
    assert (
        len(admin.read_text().strip()) >= 32 and admin.read_text().strip() not in path.read_text()
    )


def test_a_node_without_the_roles_model_file_is_refused(roots):
    with pytest.raises(StageError, match="serves no demo/model.pt"):
        _fleet(PREFIX, _nodes(1), served=False)


def test_clean_removes_the_demos_own_fleet_and_rollout_record_only(roots):
    _fleet(containers.PREFIX, _nodes(2))
    folder = demo.fleet_dir(containers.PREFIX)
    (folder / "rollout.json").write_text("{}")
    (folder / "models").mkdir()
    assert demo.forget_fleet(containers.PREFIX) == folder
    assert sorted(p.name for p in folder.iterdir()) == []
    # a fleet.json that names another load balancer (someone else's fleet) stays
    other = {"balancer": {"folder": "/elsewhere"}, "nodes": []}
    (folder / FLEET_FILE).write_text(json.dumps(other))
    assert demo.forget_fleet(containers.PREFIX) is None
    assert (folder / FLEET_FILE).is_file()


def test_demo_clean_says_it_removed_the_fleet(roots, monkeypatch):
    monkeypatch.setattr(containers, "remove_nodes", lambda prefix: [])
    _fleet(containers.PREFIX, _nodes(1))
    out = io.StringIO()
    demo.clean(Console(out, live=False), containers.PREFIX)
    assert "removed the fleet's description" in out.getvalue()
    assert not (demo.fleet_dir(containers.PREFIX) / FLEET_FILE).exists()
