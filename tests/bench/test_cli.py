"""`torchfleet-bench` (benchmarks/torchfleet_bench/cli.py): one command line over every benchmark,
each command its own module with its own options."""

from __future__ import annotations

import subprocess
import sys

import pytest
from torchfleet_bench import cli


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: torchfleet-bench COMMAND [ARGS...]")
    for name in ("load", "runtime", "peers", "http-stack", "codec", "ab", "py39"):
        assert f"\n  {name} " in out, name


def test_no_command_is_a_usage_error(capsys):
    assert cli.main([]) == 2
    assert "commands:" in capsys.readouterr().err


def test_an_unknown_command_names_the_allowed_ones(capsys):
    assert cli.main(["bench-everything"]) == 2
    assert capsys.readouterr().err.strip() == (
        "torchfleet-bench: command = 'bench-everything' is invalid; allowed: "
        "load, runtime, peers, http-stack, codec, ab, tls, replicas, edges, gpu, py39, pipeline, "
        "gpu-peers, gpu-pack, rollout-step"
    )


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_command_has_its_own_options(name, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([name, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: torchfleet-bench {name}")


def test_the_module_and_its_arguments_reach_the_command():
    proc = subprocess.run(
        [sys.executable, "-m", "torchfleet_bench", "load", "--concurrency", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "usage: torchfleet-bench load" in proc.stderr
    assert "--concurrency '0': expected a comma-separated list of positive integers" in proc.stderr
