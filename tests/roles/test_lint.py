"""Static checks of the Ansible content: `ansible-playbook --syntax-check` of every playbook,
the inventories and the role options (ansible-lint's production profile runs once, in
`scripts/test.sh lint`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PLAYBOOKS = sorted(p.name for p in (REPO / "playbooks").glob("*.yml"))
INVENTORIES = sorted(p.name for p in (REPO / "inventories").iterdir() if p.is_dir())


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax(playbook: str, tool_env: dict[str, str]) -> None:
    result = subprocess.run(
        ["ansible-playbook", "-i", "inventories/local", "--syntax-check", f"playbooks/{playbook}"],
        cwd=REPO,
        env=tool_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


@pytest.mark.parametrize("inventory", INVENTORIES)
def test_inventory_puts_nodes_under_gpu_nodes(inventory: str, tool_env: dict[str, str]) -> None:
    """Every inventory parses and declares the gpu_nodes group the playbooks target."""
    result = subprocess.run(
        ["ansible-inventory", "-i", f"inventories/{inventory}", "--graph"],
        cwd=REPO,
        env=tool_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "@gpu_nodes" in result.stdout, result.stdout
    assert "WARNING" not in result.stderr, result.stderr


def test_every_role_option_is_documented() -> None:
    """Each default of our roles has an entry in meta/argument_specs.yml and vice versa."""
    import yaml

    for role in ("pytorch", "inference_runtime", "autostop"):
        root = Path(REPO, "roles", role)
        defaults = set(yaml.safe_load((root / "defaults/main.yml").read_text()) or {})
        specs = yaml.safe_load((root / "meta/argument_specs.yml").read_text())
        options = set(specs["argument_specs"]["main"]["options"])
        assert defaults == options, (
            f"{role}: only in defaults {defaults - options}, only in specs {options - defaults}"
        )


def _strings(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _strings(k) + _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []


def test_every_role_string_is_a_valid_template() -> None:
    """Ansible templates every string of a task when it runs it; a shell script with `${#a[@]}`
    opens a Jinja comment that never ends, which neither --syntax-check nor ansible-lint sees
    (only a converge did). Parse every string of every role's YAML as Ansible will."""
    import jinja2
    import yaml

    env = jinja2.Environment()
    checked = 0
    for path in sorted(REPO.glob("roles/*/*/*.yml")):
        for text in _strings(yaml.safe_load(path.read_text())):
            if any(tag in text for tag in ("{{", "{%", "{#")):
                try:
                    env.parse(text)
                except jinja2.TemplateSyntaxError as exc:
                    pytest.fail(f"{path.relative_to(REPO)}: {exc.message} in {text[:200]!r}")
                checked += 1
    assert checked > 100, checked
