"""scripts/gpu_check.sh without a GPU: its arguments, its refusal without CUDA, and the rule its
steps 3-4 once broke (`timeout` runs a program, never a shell function: those steps could not
run). The whole script runs with `--dry-run` as benchmarks/README.md shows (minutes; not here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def timed_commands(text: str) -> list[str]:
    """The command word after each `timeout DURATION` (an array's expansion: its first word)."""
    arrays = dict(re.findall(r"^\s*([A-Z_]+)=\((\S+)", text, re.M))
    words = re.findall(r"^\s*timeout\s+\S+\s+(\S+)", text, re.M)
    out = []
    for w in words:
        m = re.fullmatch(r'"\$\{([A-Z_]+)\[@\]\}"', w)
        out.append(arrays.get(m.group(1), w) if m else w)
    return out


def test_no_step_runs_a_shell_function_under_timeout():
    text = SCRIPT.read_text()
    functions = set(re.findall(r"^\s*([a-z_]+)\(\)\s*\{", text, re.M))
    timed = timed_commands(text)
    assert len(timed) == 3  # steps 1, 3 and 4
    assert not set(timed) & functions, (timed, functions)
    # the rule catches what the script did before: a function named after timeout
    old = 'bench() { "$PY" -m torchfleet_bench "$@"; }\ntimeout 60 bench gpu --device cuda\n'
    assert set(timed_commands(old)) & set(re.findall(r"^([a-z_]+)\(\)", old, re.M)) == {"bench"}


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GPU_PACK": str(ROOT / ".cache" / "no-such-pack"), **env},
    )


def test_an_unknown_argument_is_refused_by_name():
    p = run("--fast")
    assert p.returncode == 2
    assert p.stderr.strip() == "gpu_check.sh: argument = '--fast' is invalid; allowed: --dry-run"


def test_without_cuda_it_stops_and_points_at_the_dry_run():
    p = run(PYTHON=sys.executable)  # this interpreter's torch is a CPU build (or absent)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "no usable CUDA torch" in p.stdout and "--dry-run" in p.stdout
