"""`torchfleet rotate-token` (infra/deploy/rotation.py): the two steps against a stack whose
config lives in memory (the Automation API's config calls), with `up` recorded and the endpoint
a round-robin balancer over nodes that each read the secret store at their own time (a fake
clock). That the runtime accepts both tokens and re-reads them under load:
tests/deploy/test_local_edge.py; that a node's timer rewrites its token file only when the
secret changed: tests/bootstrap/test_leave.py and tests/roles/test_token_timer.py."""

from __future__ import annotations

import contextlib
import http.server
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto
from torchfleet_compat.runtime_settings import parse_value

from infra import config, edge
from infra.deploy import automation, pipeline, rotation
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


class Clock:
    """rotation's `time`: sleeping moves it, as each probe's round trip does."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Balancer:
    """The stack's endpoint: round robin over nodes that accept the current token always and a
    token the secret store holds from `reads_after` seconds after `up` on (their timer's run)."""

    clock: Clock
    stack: Stack
    reads_after: list[float]
    up_at: float = 0.0
    sent: int = 0
    routed: int | None = None  # the first nodes the probes reach (None: all of them)

    def probe(self, token: str) -> int | None:
        node = self.sent % (self.routed or len(self.reads_after))
        self.sent += 1
        self.clock.now += 0.05
        read = self.clock.now - self.up_at >= self.reads_after[node]
        stored = {v.value for v in self.stack.config.values()} if read else set()
        return 200 if token in stored else 401


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(rotation, "time", fake)
    return fake


def _rotate(
    stack: Stack,
    console,
    finish: bool = False,
    name: str = "aws-dev",
    balancer: Balancer | None = None,
) -> list[dict]:
    ups: list[dict] = []

    def up() -> None:  # what `up` would see: the config at the time it runs
        ups.append({k: v.value for k, v in stack.config.items()})
        if balancer is not None:
            balancer.up_at = balancer.clock.now

    rotation.rotate(
        name,
        console,
        _cfg(name),
        up,
        finish=finish,
        opener=lambda _: stack,
        probe=(lambda: contextlib.nullcontext(balancer.probe)) if balancer else None,
    )
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


def test_a_group_rotation_waits_until_every_node_has_read_the_next_token(console, text, clock):
    """aws-prod: the nodes read the secret on their timer, one of them late; the step returns
    only once the endpoint accepted the next token STREAK times in a row and the nodes' refresh
    interval has passed: the probes may not reach every node (a balancer per zone), the
    interval covers the one they missed."""
    current = auto.ConfigValue("current-token-0123456789", secret=True)
    stack = Stack({rotation.CURRENT: current})
    refresh = rotation.refresh_s("aws-prod", _cfg("aws-prod"))
    assert refresh > 0 and rotation.refresh_s("aws-dev", _cfg("aws-dev")) == 0  # instances
    balancer = Balancer(clock, stack, reads_after=[1.0, 3.0, refresh - 1.0], routed=2)
    ups = _rotate(stack, console, name="aws-prod", balancer=balancer)

    following = stack.config[rotation.NEXT].value
    assert ups == [{rotation.CURRENT: current.value, rotation.NEXT: following}]
    assert clock.now - balancer.up_at >= refresh  # not before the last node's timer ran
    balancer.routed = None
    assert all(balancer.probe(following) == 200 for _ in range(3 * len(balancer.reads_after)))
    assert "accepted" in text(console) and following not in text(console)


def test_a_node_that_never_reads_the_next_token_fails_the_step_by_its_answers(console, clock):
    stack = Stack({rotation.CURRENT: auto.ConfigValue("current-token-0123456789", secret=True)})
    balancer = Balancer(clock, stack, reads_after=[1.0, float("inf")])
    with pytest.raises(StageError, match="did not accept the next token 20 times") as err:
        _rotate(stack, console, name="aws-prod", balancer=balancer)
    assert err.value.stage == "readiness" and "401" in err.value.message
    assert "api-token" in (err.value.fix or "")
    assert clock.now - balancer.up_at >= rotation.ACCEPT_TIMEOUT_S
    assert rotation.NEXT in stack.config  # both tokens stay: a re-run of --finish re-checks


def test_finish_is_refused_while_a_node_refuses_the_next_token(console, clock):
    following = auto.ConfigValue("next-token-0123456789ab", secret=True)
    current = auto.ConfigValue("current-token-0123456789", secret=True)
    stack = Stack({rotation.CURRENT: current, rotation.NEXT: following})
    balancer = Balancer(clock, stack, reads_after=[0.0, 0.0, float("inf")])
    with pytest.raises(StageError, match="not finishing the rotation of aws-prod") as err:
        _rotate(stack, console, finish=True, name="aws-prod", balancer=balancer)
    assert err.value.stage == "refused" and "401" in err.value.message
    assert stack.config == {rotation.CURRENT: current, rotation.NEXT: following}  # untouched

    balancer.reads_after[2] = 0.0  # the last node read the secret: now it finishes
    ups = _rotate(stack, console, finish=True, name="aws-prod", balancer=balancer)
    assert ups == [{rotation.CURRENT: following.value}]


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


class _Runtime(http.server.BaseHTTPRequestHandler):
    """GET /v1/model behind a bearer token, as the runtime answers it."""

    accepted = {"Bearer current-token-0123456789", "Bearer next-token-0123456789ab"}

    def do_GET(self) -> None:
        ok = self.path == "/v1/model" and self.headers.get("Authorization") in self.accepted
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_the_endpoint_probe_sends_the_token_it_is_given_to_the_stacks_endpoint(monkeypatch):
    """The probe `rotate-token` checks with: a real request over loopback to the stack's
    endpoint output, with the token under test instead of the stack's api_token output."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Runtime)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/"
    values = {"endpoint": endpoint, "api_token": "current-token-0123456789"}
    monkeypatch.setattr(automation, "outputs", lambda stack: automation.Outputs(values))
    try:
        with pipeline.endpoint_probe("aws-prod", _cfg("aws-prod"), None) as probe:
            assert probe("next-token-0123456789ab") == 200
            assert probe("old-token-0123456789abcd") == 401
            assert probe("current-token-0123456789") == 200
    finally:
        server.shutdown()
        server.server_close()
    assert probe("next-token-0123456789ab") is None  # nothing answers: a state, not an error
