"""What the rollout tests share: the engine a canary runs with over a cloud stack's program, on
a clock the test owns (windows of 5 s, bakes of 10 s, no real time passes); and the live fleets'
helpers (live_fleet.py), importable by name."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.rollout.engine import Options, Rollout
from infra.rollout.policy import GuardSettings
from infra.rollout.ref import Store
from infra.rollout.state import RolloutState

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # live_fleet, importable by name (tests/e2e too)


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
