"""The Python 3.8 guard for the node packages must catch what it claims to catch, and pass
runtime/ and compat/ (both run on Python 3.8 nodes)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_py38", ROOT / "scripts" / "check_py38.py")
check_py38 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_py38)


@pytest.mark.parametrize(
    "source, needle",
    [
        ("match x:\n    case 1:\n        pass\n", "not Python 3.8 syntax"),
        ("with (open('a') as a, open('b') as b):\n    pass\n", "not Python 3.8 syntax"),
        ("Alias = dict[str, int]\n", "dict[...] at run time"),
        ("'abc'.removeprefix('a')\n", ".removeprefix needs Python 3.9"),
        ("import functools\n@functools.cache\ndef f(): pass\n", ".cache needs Python 3.9"),
        ("list(zip([1], [2], strict=True))\n", "zip(strict=...) needs Python 3.10"),
    ],
)
def test_flags_post_38_code(source, needle):
    problems = check_py38.check_source(source)
    assert any(needle in p for p in problems), problems


def test_accepts_38_code_with_postponed_annotations():
    source = (
        "from __future__ import annotations\n"
        "from typing import Dict, List\n"
        "def f(x: list[int]) -> dict[str, int]:\n"
        "    y: tuple[int, ...] = (1,)\n"
        "    return {'a': len(x)}\n"
        "Alias = Dict[str, List[int]]\n"
    )
    assert check_py38.check_source(source) == []


@pytest.mark.parametrize("package", ["runtime/src", "compat/src"])
def test_node_packages_are_38_clean(package):
    assert check_py38.main([str(ROOT / package)]) == 0


def test_the_lint_step_checks_every_node_package():
    lint = (ROOT / "scripts" / "test.sh").read_text()
    line = next(x for x in lint.splitlines() if "scripts/check_py38.py" in x)
    assert "runtime/src" in line and "compat/src" in line


@pytest.mark.parametrize(
    "source, flagged",
    [
        # the 3.8 grammar: ruff (target py38) reports these itself
        ("match x:\n    case 1:\n        pass\n", True),
        ("with (open('a') as a, open('b') as b):\n    pass\n", True),
        # what only check_py38 sees, and why it stays: run-time generics and newer stdlib APIs
        ("Alias = dict[str, int]\n", False),
        ("'abc'.removeprefix('a')\n", False),
        ("import functools\n@functools.cache\ndef f(): pass\n", False),
        ("list(zip([1], [2], strict=True))\n", False),
    ],
)
def test_what_ruff_catches_for_py38(source, flagged, tmp_path):
    path = tmp_path / "m.py"
    path.write_text(source)
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run(
        [
            str(ruff),
            "check",
            "--isolated",
            "--target-version",
            "py38",
            "--select",
            "E,F,W,UP,FA",
            "--ignore",
            "F821",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ("invalid-syntax" in done.stdout) is flagged, done.stdout
    # and check_py38 catches every one of them
    assert check_py38.check_source(source)
