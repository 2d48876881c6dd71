"""What the rollout tests share: the engine a canary runs with over a cloud stack's program, on
a clock the test owns (windows of 5 s, bakes of 10 s, no real time passes); the operator's
Alibaba keys as the loopback fake (tests/bootstrap/fake_alibaba.py) expects them; moto's S3 with
aws-prod's model bucket; and this folder's helpers (live_fleet, ess_sim, cms_sim, fixed_windows,
aws_prod_stack) and the fake, importable by name (tests/e2e too)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from infra.rollout.engine import Options, Rollout
from infra.rollout.policy import GuardSettings
from infra.rollout.ref import Store
from infra.rollout.state import RolloutState

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "bootstrap"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
from aws_prod_stack import BUCKET, REGION  # noqa: E402
from fake_alibaba import ACCESS_KEY, SECRET, TOKEN  # noqa: E402


@pytest.fixture
def alibaba_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's Alibaba keys in the environment (infra.credentials.alicloud_keys reads
    them), the fake account's, and no other key or profile."""
    for name in ("ALICLOUD_ACCESS_KEY", "ALICLOUD_SECRET_KEY", "ALICLOUD_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", SECRET)
    monkeypatch.setenv("ALIBABA_CLOUD_SECURITY_TOKEN", TOKEN)


@pytest.fixture
def canary_engine(tmp_path: Path) -> Callable[[Any, Any], Rollout]:
    """canary_engine(fleet, windows): a canary Rollout recording to tmp_path/rollout.json."""

    def make(fleet: Any, windows: Any) -> Rollout:
        clock = [0.0]

        def sleep(s: float) -> None:
            clock[0] += s

        return Rollout(
            fleet,
            RolloutState(tmp_path / "rollout.json"),
            Store(tmp_path / "store"),
            windows,
            Options(strategy="canary", bake_s=10, window_s=5, guards=GuardSettings()),
            say=lambda _: None,
            clock=lambda: clock[0],
            sleep=sleep,
        )

    return make


@pytest.fixture
def s3() -> Iterator[object]:
    """moto's S3 client with aws-prod's model bucket (aws_prod_stack.BUCKET) created."""
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=BUCKET)
        yield client
