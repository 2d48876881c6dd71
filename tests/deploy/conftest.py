"""Fixtures for the deploy-stage tests: a machine with nothing configured (no cloud
credentials, no Pulumi CLI or login, no SSH key), a fake `pulumi` that records every call, the
recorded engine events of aws-dev, and a console whose output the tests read."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.deploy.progress import Console

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
VENV_BIN = Path(sys.executable).parent
CLOUD_ENV = ("AWS_", "ALICLOUD_", "ALIBABA_CLOUD_", "PULUMI_", "SSH_AUTH_SOCK")

FAKE_PULUMI = """#!/bin/sh
# A stand-in for the Pulumi CLI: records each call, answers `version` and `whoami`, and fails
# anything else loudly (a test that reaches it has created something).
echo "$*" >> {log}
case "$1" in
  version) echo v3.272.0 ;;
  whoami) echo '{{"user":"tester","url":"file:///tmp/state"}}' ;;
  *) echo "fake pulumi: refusing '$*'" >&2; exit 97 ;;
esac
"""


@pytest.fixture
def bare_machine(tmp_path, monkeypatch) -> Path:
    """HOME is empty, no cloud or Pulumi variables, PATH has no pulumi."""
    home = tmp_path / "home"
    home.mkdir()
    for key in list(os.environ):
        if key.startswith(CLOUD_ENV):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{VENV_BIN}:/usr/bin:/bin")
    return home


@pytest.fixture
def fake_pulumi(tmp_path, monkeypatch, bare_machine) -> Path:
    """A recording `pulumi` first on PATH and a self-managed backend with a passphrase; returns
    the call log."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "pulumi-calls.log"
    log.touch()
    script = bindir / "pulumi"
    script.write_text(FAKE_PULUMI.format(log=log))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{VENV_BIN}:/usr/bin:/bin")
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path / 'state'}")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "test-only")
    return log


@pytest.fixture
def ssh_key(bare_machine) -> tuple[Path, str]:
    """An ed25519 key pair in ~/.ssh; returns (private key, public line)."""
    key = bare_machine / ".ssh" / "id_ed25519"
    key.parent.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tester", "-f",
                    str(key)], check=True, timeout=60)
    return key, key.with_name("id_ed25519.pub").read_text().strip()


@pytest.fixture
def console() -> Console:
    return Console(io.StringIO(), live=False)


def text(console: Console) -> str:
    return console.stream.getvalue()  # type: ignore[attr-defined]


@pytest.fixture(name="text")
def text_fixture():
    return text


@pytest.fixture
def recorded():
    """Loader of the recorded aws-dev engine events/outputs (tests/deploy/record_engine_events.py)."""

    def load(name: str):
        return json.loads((FIXTURES / name).read_text())

    return load


@pytest.fixture
def stack_with(monkeypatch):
    """Serve Pulumi.<stack>.yaml's values, some replaced, to the preflight."""
    from infra.deploy import preflight
    from infra.plan import load_stack_config

    def patch(stack: str, **values):
        changed = {**load_stack_config(stack),
                   **{f"torchfleet:{k}": v for k, v in values.items()}}
        monkeypatch.setattr(preflight, "load_stack_config", lambda name, path=None: (
            changed if name == stack else load_stack_config(name, path)))

    return patch


@pytest.fixture
def aws_keys(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")


@pytest.fixture
def trap_dirs(monkeypatch, tmp_path):
    """Run logs and inventories of `torchfleet up|down|status` in tmp_path, not the checkout."""
    from infra.deploy import pipeline

    monkeypatch.setattr(pipeline, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(pipeline, "INVENTORIES", tmp_path / "inventories")
    return tmp_path
