"""A user can copy any command the repository shows (README, docs/, the READMEs beside the code,
the example stacks' comments, the code's own messages) and it exists with those options; the CLI
reference pages are the parsers' help. The commands are checked against the real argparse trees
and the Makefile (commands.py), no process started per command."""

from __future__ import annotations

import pytest
from commands import Shown, cli_reference, problems, shown
from docs_support import REPO


def test_every_command_the_repository_shows_exists():
    found, checked = problems(shown())
    assert checked > 300, f"only {checked} commands found: is the extraction still finding them?"
    assert not found, "commands that do not exist as shown:\n  " + "\n  ".join(found)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("torchfleet-runtime bench --url http://127.0.0.1:8080", "no subcommand 'bench'"),
        ("torchfleet up aws-dev --skip-provisioning", "no option --skip-provisioning"),
        ("torchfleet rollout status aws-dev --steps 5,100 --speed 2", "no option --speed"),
        ("torchfleet-bench load URL --no-such", "torchfleet-bench load: no option --no-such"),
        ("torchfleet-runtime check --no-such", "torchfleet-runtime check: no option --no-such"),
        ("$ make setup && make deploy STACK=aws-dev", "make: no target 'deploy'"),
        ("make demo NODE_COUNT=3", "make: no variable NODE_COUNT"),
        ("torchfleet up|down|destroy STACK", "no subcommand 'destroy'"),
    ],
)
def test_the_check_names_a_stale_command_or_flag(line, problem):
    found, checked = problems([Shown("here:1", line)])
    assert checked >= 1 and len(found) == 1 and problem in found[0], found


@pytest.mark.parametrize(
    "line",
    [
        "torchfleet -v demo --nodes 2 --no-bench",
        "torchfleet rollout abort STACK",
        "torchfleet cost STACK [--since N{d,w}]",
        "torchfleet plan aws-dev aws-prod --json | jq .",
        "torchfleet-runtime serve --model /tmp/m.pt --port 8080 &",
        "torchfleet-runtime --version",
        "torchfleet-bench COMMAND --help",
        "make image BASE=localhost/x:latest PROFILE=cpu   # offline",
        "NODES=2 make demo",
    ],
)
def test_the_check_accepts_what_the_parsers_accept(line):
    places = [Shown("here:1", line)]
    assert problems(places) == ([], 1)


def test_the_cli_reference_pages_are_the_parsers_help():
    stale = [
        str(path.relative_to(REPO))
        for path, text in cli_reference.pages().items()
        if not path.is_file() or path.read_text() != text
    ]
    assert not stale, f"stale: {stale}; run .venv/bin/python scripts/cli_reference.py"
    # every subcommand of every program has its section
    for name, command in cli_reference.parsers().items():
        text = (REPO / "docs" / "reference" / f"cli-{name}.md").read_text()
        for sub in command.walk():
            assert f"## `{sub.prog}`" in text
