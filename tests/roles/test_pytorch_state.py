"""roles/pytorch/files/torch_state.py, run for real with this venv's torch: the pin check and
torch's report, asked once and then served from its cache until what it depends on changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "roles/pytorch/files/torch_state.py"
PINS = [f"torch=={torch.__version__.split('+')[0]}", "numpy>=1.21"]


def state(cache: Path, *pins: str) -> dict:
    # the role runs it as `python -c <the file's text> CACHE PINS...`
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.read_text(), str(cache), *pins],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(done.stdout)


def test_torch_is_asked_once_then_the_cached_report_is_served(tmp_path: Path) -> None:
    cache = tmp_path / "report.json"
    first = state(cache, *PINS)
    assert first["satisfied"] is True and first["asked"] is True
    report = first["report"]
    assert report["torch"] == torch.__version__ and report["cuda"] == torch.version.cuda
    assert report["numpy_bridge"] is True
    again = state(cache, *PINS)
    assert again["asked"] is False and again["report"] == report
    # anything the answer depends on differs (here: the recorded driver state): asked again
    saved = json.loads(cache.read_text())
    saved["key"]["driver"] = {"loaded": "NVRM version: 535.104.05", "device": True}
    cache.write_text(json.dumps(saved))
    assert state(cache, *PINS)["asked"] is True
    cache.write_text("not json")  # a damaged cache is asked again too, not an error
    assert state(cache, *PINS)["asked"] is True


def test_a_missing_pin_reports_no_torch_answer(tmp_path: Path) -> None:
    out = state(tmp_path / "report.json", "torch==0.0.1", "surely-not-installed-pkg==1.0")
    assert out["satisfied"] is False and out["report"] is None and out["asked"] is False
    assert out["installed"]["surely-not-installed-pkg"] is None
    assert out["installed"]["torch"] == torch.__version__
    assert not (tmp_path / "report.json").exists()
