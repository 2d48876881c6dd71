"""`torchfleet rotate-token` (infra/deploy/rotation.py): the two steps against a stack whose
config lives in memory (the Automation API's config calls), with `up` recorded. That the runtime
accepts both tokens and re-reads them under load: tests/deploy/test_local_edge.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto
from torchfleet_compat.runtime_settings import parse_value

from infra import config, edge
from infra.deploy import rotation
from infra.deploy.stage import StageError
from infra.plan import load_stack_config

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    config: dict[str, auto.ConfigValue] = field(default_factory=dict)

    def get_all_config(self) -> dict[str, auto.ConfigValue]:
        return dict(self.config)

    def get_config(self, key: str) -> auto.ConfigValue:
        return self.config[key]

    def set_config(self, key: str, value: auto.ConfigValue) -> None:
        self.config[key] = value

    def remove_config(self, key: str) -> None:
        del self.config[key]


def _cfg(stack: str) -> config.StackConfig:
    return config.load(config.raw_from_pulumi_config(load_stack_config(stack)), stack)


def _rotate(stack: Stack, console, finish: bool = False, name: str = "aws-dev") -> list[dict]:
    ups: list[dict] = []

    def up() -> None:  # what `up` would see: the config at the time it runs
        ups.append({k: v.value for k, v in stack.config.items()})

    rotation.rotate(name, console, _cfg(name), up, finish=finish, opener=lambda _: stack)
    return ups


def test_the_next_token_is_a_secret_the_nodes_accept_beside_the_current(console, text):
    stack = Stack({rotation.CURRENT: auto.ConfigValue("current-token-0123456789", secret=True)})
    ups = _rotate(stack, console)
    following = stack.config[rotation.NEXT]
    assert following.secret and len(following.value) == edge.TOKEN_LENGTH
    assert parse_value("api_token", following.value) == following.value  # the runtime takes it
    assert ups == [{rotation.CURRENT: "current-token-0123456789", rotation.NEXT: following.value}]
    assert following.value not in text(console) and "--finish" in text(console)
    assert rotation.new_token() != following.value

    # a second start while one is under way changes nothing
    with pytest.raises(StageError, match="under way"):
        _rotate(stack, console)
    assert stack.config[rotation.NEXT] == following


def test_finish_makes_the_next_token_the_only_one(console, text):
    stack = Stack({rotation.NEXT: auto.ConfigValue("next-token-0123456789ab", secret=True)})
    ups = _rotate(stack, console, finish=True)
    assert ups == [{rotation.CURRENT: "next-token-0123456789ab"}]
    assert stack.config[rotation.CURRENT].secret and rotation.NEXT not in stack.config
    with pytest.raises(StageError, match="no rotation of aws-dev to finish"):
        _rotate(stack, console, finish=True)


def test_a_group_stack_is_refused_before_anything_changes(console):
    stack = Stack()
    with pytest.raises(StageError, match="group stack") as err:
        _rotate(stack, console, name="aws-prod")
    assert err.value.stage == "refused" and stack.config == {}


def test_a_stack_file_with_secret_tokens_still_plans(tmp_path):
    """`rotate-token` writes the tokens as Pulumi secrets: the preflight and the offline plan
    read a placeholder for them; any other secret is still refused offline."""
    values = yaml.safe_load((REPO / "Pulumi.aws-dev.yaml").read_text())
    values["config"]["torchfleet:api_token"] = {"secure": "v1:AAAA"}
    values["config"]["torchfleet:api_token_next"] = {"secure": "v1:BBBB"}
    path = tmp_path / "Pulumi.aws-dev.yaml"
    path.write_text(yaml.safe_dump(values))
    loaded = load_stack_config("aws-dev", path)
    cfg = config.load(config.raw_from_pulumi_config(loaded), "aws-dev")
    assert cfg.api_token == edge.offline_placeholder("api_token")
    assert cfg.api_token_next == edge.offline_placeholder("api_token_next")
    values["config"]["torchfleet:image"] = {"secure": "v1:CCCC"}
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(config.ConfigError, match="torchfleet:image is a Pulumi secret"):
        load_stack_config("aws-dev", path)
