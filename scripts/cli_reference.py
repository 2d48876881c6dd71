#!/usr/bin/env python3
"""The project's three command lines as their argparse trees, and the reference pages written
from them.

    .venv/bin/python scripts/cli_reference.py          # rewrite docs/reference/cli-*.md
    .venv/bin/python scripts/cli_reference.py --check  # exit 1 naming the stale pages

`parsers()` builds each command's real parser without running the command: `torchfleet`
(infra/cli.py), `torchfleet-runtime` (runtime/src/torchfleet_runtime/cli.py, whose `check` and
`diagnose` are plugins parsed by their own modules) and `torchfleet-bench`
(benchmarks/torchfleet_bench/cli.py, whose commands build their parser inside `main`: it is
taken at its `parse_args` call, before the command does anything). tests/docs/ checks every
command the docs show against these trees and fails when a page here is stale.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
PAGES = REPO / "docs" / "reference"
# argparse wraps help at the terminal's width: one fixed width, so a page does not depend on
# the terminal that wrote it
COLUMNS = "100"


@dataclass
class Command:
    """One command line: its parser (None where the program parses by hand, as the top level
    of torchfleet-bench does), its subcommands, and the help text a user sees."""

    prog: str
    parser: argparse.ArgumentParser | None
    help: str
    subcommands: dict[str, Command] = field(default_factory=dict)

    def walk(self) -> Iterator[Command]:
        yield self
        for sub in self.subcommands.values():
            yield from sub.walk()


class _Taken(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


def _taken_parser(main: object) -> argparse.ArgumentParser:
    """The parser a command's `main(argv)` builds, taken when it calls parse_args."""

    def take(self: argparse.ArgumentParser, *_: object, **__: object) -> None:
        raise _Taken(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", take):
        try:
            main([])  # type: ignore[operator]
        except _Taken as taken:
            return taken.parser
    raise AssertionError(f"{main!r} returned without parsing its arguments")


def _help(parser: argparse.ArgumentParser) -> str:
    with mock.patch.dict(os.environ, {"COLUMNS": COLUMNS}):
        return parser.format_help()


def _tree(parser: argparse.ArgumentParser, replace: dict[str, argparse.ArgumentParser]) -> Command:
    command = Command(parser.prog, parser, _help(parser))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                command.subcommands[name] = _tree(replace.get(name, sub), replace)
    return command


def torchfleet() -> Command:
    from infra import cli

    return _tree(cli._parser(), {})


def torchfleet_runtime() -> Command:
    from torchfleet_runtime import cli

    plugins = {}
    for name, (module_name, help_text) in cli.PLUGINS.items():
        # as cli._run_plugin builds it
        parser = argparse.ArgumentParser(prog=f"torchfleet-runtime {name}", description=help_text)
        importlib.import_module(module_name).configure_parser(parser)
        plugins[name] = parser
    return _tree(cli.build_parser(), plugins)


def torchfleet_bench() -> Command:
    from torchfleet_bench import cli

    command = Command(cli.PROG, None, cli.usage() + "\n")
    for name, (module_name, _) in cli.COMMANDS.items():
        module = importlib.import_module(f"torchfleet_bench.{module_name}")
        command.subcommands[name] = _tree(_taken_parser(module.main), {})
    return command


def parsers() -> dict[str, Command]:
    """Each program's command tree, by the name a user types."""
    return {
        "torchfleet": torchfleet(),
        "torchfleet-runtime": torchfleet_runtime(),
        "torchfleet-bench": torchfleet_bench(),
    }


SOURCES = {
    "torchfleet": "infra/cli.py",
    "torchfleet-runtime": "runtime/src/torchfleet_runtime/cli.py",
    "torchfleet-bench": "benchmarks/torchfleet_bench/cli.py",
}


def page(name: str, command: Command) -> str:
    lines = [
        f"# `{name}`",
        "",
        f"Generated from the parser ({SOURCES[name]}) by `scripts/cli_reference.py`: edit the",
        "parser's help, then run that script; `tests/docs/` fails while this page is stale.",
    ]
    for sub in command.walk():
        lines += ["", f"## `{sub.prog}`", "", "```text", sub.help.rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


def pages() -> dict[Path, str]:
    return {PAGES / f"cli-{name}.md": page(name, cmd) for name, cmd in parsers().items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    args = ap.parse_args(argv)
    stale = []
    for path, text in pages().items():
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(path.relative_to(REPO))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'} {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
