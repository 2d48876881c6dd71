"""Every command the repository shows a user, and the check of one against the real parsers
and the Makefile.

Where commands are taken from (`shown()`):
- Markdown (README.md, docs/, runtime/README.md, benchmarks/README.md, the roles' READMEs):
  code spans and the lines of fenced blocks;
- the example stacks' comments (Pulumi.*.yaml), the Makefile's and the shell scripts' (their
  messages too): code spans, and comment lines that start with a command;
- the code's strings (error messages, usage lines, docstrings) in infra/, runtime/src/,
  compat/src/, benchmarks/torchfleet_bench/ and scripts/: code spans, and indented lines (a
  usage block) that start with `torchfleet`, `torchfleet-runtime` or `torchfleet-bench`.
A line is split at `&&`, `||`, `;` and `|`; each part whose first word (after `$`, `sudo`,
`env` and `NAME=value` words) is one of the programs is a command. What follows `#` is a
comment, and so is what follows two spaces or more (a column of descriptions). `STACK`,
`<stack>`, `…` and other placeholders stand for anything.

What is checked (`problems()`): each subcommand exists (`torchfleet rollout`), each option
exists on the (sub)command it follows or on one above it, and for `make` each target is one of
the Makefile's and each `NAME=value` a variable the Makefile or its scripts read."""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from docs_support import REPO, pages, readmes

_spec = importlib.util.spec_from_file_location("cli_reference", REPO / "scripts/cli_reference.py")
assert _spec and _spec.loader
cli_reference = importlib.util.module_from_spec(_spec)
sys.modules["cli_reference"] = cli_reference  # its dataclasses look their module up
_spec.loader.exec_module(cli_reference)

PROGRAMS = ("torchfleet", "torchfleet-runtime", "torchfleet-bench")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
SEPARATOR = re.compile(r"\s(?:&&|\|\||;|\|)\s|\s&$")
# a word that stands for a value the user chooses
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|.*<[^>]*>.*|\.\.\.|….*|.*…)$")
CODE_DIRS = ("infra", "runtime/src", "compat/src", "benchmarks/torchfleet_bench", "scripts")


@dataclass(frozen=True)
class Shown:
    where: str  # file:line
    text: str


def markdown_files() -> list[Path]:
    return [*pages(), *readmes()]


def _lines_with_number(text: str, start: int) -> Iterator[tuple[int, str]]:
    first = text.count("\n", 0, start) + 1
    for offset, line in enumerate(text[start:].splitlines()):
        yield first + offset, line


def _from_markdown(path: Path) -> Iterator[Shown]:
    text = path.read_text()
    name = path.relative_to(REPO)
    fenced = [(m.start(1), m.end(1)) for m in FENCE.finditer(text)]
    for start, end in fenced:
        for number, line in _lines_with_number(text[:end], start):
            yield Shown(f"{name}:{number}", line)
    for match in CODE_SPAN.finditer(text):
        if not any(s <= match.start() < e for s, e in fenced):
            yield Shown(f"{name}:{text.count(chr(10), 0, match.start()) + 1}", match.group(1))


def _from_comments(path: Path) -> Iterator[Shown]:
    """A stack file's, a script's or the Makefile's comments: a comment line that starts with a
    command, and code spans anywhere in the file (a script's messages)."""
    name = path.relative_to(REPO)
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if "#" in line:
            yield Shown(f"{name}:{number}", line.split("#", 1)[1])
        for span in CODE_SPAN.findall(line):
            yield Shown(f"{name}:{number}", span)


def _from_code(path: Path) -> Iterator[Shown]:
    name = path.relative_to(REPO)
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        for offset, line in enumerate(node.value.splitlines()):
            where = f"{name}:{node.lineno + offset}"
            # a usage block: an indented line that starts with a program (prose that starts
            # with one, "torchfleet-runtime needs Python ...", is not a command)
            if line.startswith("    ") and line.strip().split(" ", 1)[0] in PROGRAMS:
                yield Shown(where, line)
            for span in CODE_SPAN.findall(line):
                yield Shown(where, span)


def shell_scripts() -> list[Path]:
    return sorted(p for d in ("scripts", "benchmarks") for p in (REPO / d).rglob("*.sh"))


def code_files() -> list[Path]:
    return [
        p for d in CODE_DIRS for p in sorted((REPO / d).rglob("*.py")) if "egg-info" not in str(p)
    ]


def shown() -> list[Shown]:
    """Every place a command could be shown (each is checked only if it is one)."""
    out = [s for p in markdown_files() for s in _from_markdown(p)]
    commented = [*sorted(REPO.glob("Pulumi.*.yaml")), REPO / "Makefile", *shell_scripts()]
    out += [s for p in commented for s in _from_comments(p)]
    out += [s for p in code_files() for s in _from_code(p)]
    return out


def commands(text: str) -> Iterator[list[str]]:
    """The commands in one line: each as its words, from the program's name on."""
    # two spaces or more end a command: what follows is a column of descriptions
    text = re.split(r"\s{2,}", text.strip().removeprefix("$ "), maxsplit=1)[0]
    for part in SEPARATOR.split(" " + text + " "):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:  # an unbalanced quote in a shortened example
            words = part.split()
        while words and (words[0] in ("$", "sudo", "env", "exec") or _assignment(words[0])):
            words.pop(0)
        if words and (words[0] in PROGRAMS or words[0] == "make"):
            yield words


def _assignment(word: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word) is not None


# -- the check ------------------------------------------------------------------------------------


def makefile() -> tuple[set[str], set[str]]:
    """The Makefile's targets, and the variables a `make` line may set: those the Makefile
    names, and those its scripts read from the environment."""
    text = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", text, re.M))
    readers = [text, *(p.read_text() for p in sorted((REPO / "scripts").glob("*.sh")))]
    readers.append((REPO / "infra" / "cli.py").read_text())  # NODES (`demo --nodes`)
    variables = {v for t in readers for v in re.findall(r"\b([A-Z][A-Z0-9_]+)\b", t)}
    return targets, variables


def _options(chain: list[argparse.ArgumentParser]) -> dict[str, argparse.Action]:
    out: dict[str, argparse.Action] = {}
    for parser in chain:
        out.update(parser._option_string_actions)
    return out


def check(words: list[str], trees: dict, make: tuple[set[str], set[str]]) -> str | None:
    """None when the command exists with those options, else what does not."""
    words = [w.strip("[]") for w in words]
    words = [w for w in words if w]
    if words[0] == "make":
        targets, variables = make
        for word in words[1:]:
            if PLACEHOLDER.match(word) or word.startswith("-"):
                continue
            if _assignment(word):
                name = word.split("=", 1)[0]
                if name not in variables:
                    return f"make: no variable {name} in the Makefile or its scripts"
            elif word not in targets:
                return f"make: no target {word!r} (targets: {', '.join(sorted(targets))})"
        return None
    command = trees[words[0]]
    chain = [command.parser] if command.parser else []
    rest = words[1:]
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if PLACEHOLDER.match(word):
            if command.subcommands and not word.startswith("-"):
                return None  # `torchfleet COMMAND`: any of them
            continue
        if word.startswith("-") and len(word) > 1 and not re.match(r"-\d", word):
            option = word.split("=", 1)[0]
            action = _options(chain).get(option)
            if action is None:
                if command.parser is None and option in ("-h", "--help"):
                    continue
                known = sorted(o for o in _options(chain) if o.startswith("--"))
                return f"{command.prog}: no option {option} ({', '.join(known)})"
            nargs = action.nargs
            if "=" in word or nargs == 0:
                continue
            if nargs in ("+", "*"):
                while i < len(rest) and not rest[i].startswith("-"):
                    i += 1
            elif not isinstance(nargs, str):
                i += nargs or 1
            continue
        if command.subcommands and "|" in word:  # `torchfleet up|down|status`: each of them
            unknown = [w for w in word.split("|") if w not in command.subcommands]
            if unknown:
                return f"{command.prog}: no subcommand {unknown[0]!r} (subcommands: " + (
                    ", ".join(command.subcommands) + ")"
                )
            return None
        if command.subcommands:
            sub = command.subcommands.get(word)
            if sub is None:
                if not re.fullmatch(r"[a-z][\w-]*", word):
                    return None  # not a command after all (a diagram's label, a URL)
                return (
                    f"{command.prog}: no subcommand {word!r} "
                    f"(subcommands: {', '.join(command.subcommands)})"
                )
            command = sub
            chain.append(sub.parser)
    return None


@functools.lru_cache(maxsize=1)
def _trees() -> dict:
    return cli_reference.parsers()


def problems(places: list[Shown]) -> tuple[list[str], int]:
    """What is wrong with the commands among `places`, and how many commands were checked."""
    trees = _trees()
    make = makefile()
    out, checked = [], 0
    for place in places:
        for words in commands(place.text):
            checked += 1
            problem = check(words, trees, make)
            if problem:
                out.append(f"{place.where}: `{' '.join(words)}`: {problem}")
    return out, checked
