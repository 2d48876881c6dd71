"""Fail on Python 3.9+ syntax or stdlib APIs in code that must run on Python 3.8 nodes.

ruff (target py38) flags PEP 585/604 annotations (FA102) and the 3.8 grammar itself (match,
parenthesised context managers: "invalid-syntax"); this check adds what ruff does not see:
builtin generics used at run time (`list[int]` outside annotations) and stdlib APIs that
appeared after 3.8 (tests/repo/test_check_py38.py shows which is which). It still parses
with the 3.8 grammar, so it stands alone as well. The real proof is the legacy Molecule scenario, which runs the
runtime on Python 3.9 + torch 1.12.1; this check is the fast guard for 3.8 syntax.

Usage: python scripts/check_py38.py PATH... ; exits 1 and lists file:line: problem.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}
# attribute or name -> the Python version that introduced it
NEW_APIS = {
    "removeprefix": "3.9",
    "removesuffix": "3.9",
    "to_thread": "3.9",
    "bit_count": "3.10",
    "pairwise": "3.10",
    "cache": "3.9",  # functools.cache
    "lcm": "3.9",
    "aiter": "3.10",
    "anext": "3.10",
}
NEW_KEYWORDS = {
    ("zip", "strict"): "3.10",
    ("dataclass", "slots"): "3.10",
    ("dataclass", "kw_only"): "3.10",
}


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an annotation (those are fine with postponed evaluation)."""
    found: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            found.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            args = node.args
            for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if a is not None:
                    mark(a.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
    return found


def _callee_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def check_source(source: str, filename: str = "<string>") -> list[str]:
    try:
        tree = ast.parse(source, filename=filename, feature_version=(3, 8))
    except SyntaxError as exc:
        return [f"{filename}:{exc.lineno}: not Python 3.8 syntax: {exc.msg}"]
    problems = []
    in_annotation = _annotation_nodes(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id in BUILTIN_GENERICS
            and id(node) not in in_annotation
        ):
            problems.append(
                f"{filename}:{line}: {node.value.id}[...] at run time needs 3.9 (use typing)"
            )
        elif isinstance(node, ast.Attribute) and node.attr in NEW_APIS:
            problems.append(f"{filename}:{line}: .{node.attr} needs Python {NEW_APIS[node.attr]}")
        elif isinstance(node, ast.Name) and node.id in ("aiter", "anext"):
            problems.append(f"{filename}:{line}: {node.id}() needs Python {NEW_APIS[node.id]}")
        elif isinstance(node, ast.Call):
            name = _callee_name(node.func)
            for kw in node.keywords:
                version = NEW_KEYWORDS.get((name, kw.arg))
                if version:
                    problems.append(
                        f"{filename}:{line}: {name}({kw.arg}=...) needs Python {version}"
                    )
    return problems


def main(paths: list[str]) -> int:
    problems = []
    files = []
    for p in map(Path, paths):
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    for f in files:
        problems.extend(check_source(f.read_text(encoding="utf-8"), str(f)))
    for p in problems:
        print(p)
    print(f"checked {len(files)} files for Python 3.8: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["runtime/src"]))
