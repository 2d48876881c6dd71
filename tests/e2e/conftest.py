"""The e2e tests reuse the rollout tests' live-fleet helpers (tests/rollout/live_fleet.py)."""

from __future__ import annotations

import sys
from pathlib import Path

ROLLOUT_TESTS = Path(__file__).resolve().parents[1] / "rollout"
if str(ROLLOUT_TESTS) not in sys.path:
    sys.path.insert(0, str(ROLLOUT_TESTS))
