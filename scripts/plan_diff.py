"""Do two commits plan the same? `python scripts/plan_diff.py [BASE] [HEAD]` renders the offline
plan (infra.plan under Pulumi's mock engine: JSON and text) of every example stack at both
commits and compares them byte for byte in a canonical form. BASE defaults to `main`, HEAD to
the working tree. For a change that must leave the deployed resources alone (a refactor of
infra/).

The mock engine registers resources as their inputs resolve, so the order of the resources and
of their inputs changes from run to run of one commit: the canonical JSON sorts the keys and
the resources (by type, name, inputs), and every output and input value is compared exactly;
the text's wrapping follows that order too, so its canonical form is the sorted list of its
words (every name, property and figure, without the tree's glyphs). A Python object's address
(`<... object at 0x...>`) and the copy's own path (where its bundle file lies) are masked.

Each commit is unpacked with `git archive` under .cache/plan-diff/ and planned by this
repository's Python with that copy first on the path (the script checks that the copy's infra
is the one imported). Prices are the reference table and the clock is pinned (TORCHFLEET_NOW),
so the outputs depend on the code and the stack files only. Exit 0: the same; 1: the first
differing lines of each stack that differs."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".cache" / "plan-diff"
NOW = "2026-01-05T09:00:00Z"  # any fixed instant: both commits plan at the same one
ADDRESS = re.compile(rb"object at 0x[0-9a-f]+")
TREE = "│├└─".encode()  # the tree's glyphs: where a resource hangs, not what it is
SHOWN = 40  # diff lines printed per differing output


def tree(ref: str | None) -> Path:
    """A copy of `ref`'s files (None: the working tree itself)."""
    if ref is None:
        return REPO
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dest = WORK / sha
    if not (dest / "infra").is_dir():
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", sha], cwd=REPO, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def canonical(out: bytes, as_json: bool, root: Path) -> bytes:
    """`out` in an order that does not depend on the mock engine's timing."""
    out = ADDRESS.sub(b"object at 0x?", out).replace(str(root).encode(), b"<repository>")
    if as_json:
        try:
            data = json.loads(out)
        except ValueError:
            return out  # an error message: compared as it is
        data["resources"] = sorted(
            data["resources"],
            key=lambda r: (r["type"], r["name"], json.dumps(r, sort_keys=True)),
        )
        return json.dumps(data, indent=1, sort_keys=True).encode() + b"\n"
    return b"\n".join(sorted(w for w in out.split() if w.strip(TREE))) + b"\n"


def render(root: Path, stack: str, *flags: str) -> bytes:
    """The offline plan of `stack` as the code under `root` prints it, in canonical form."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(root / "compat" / "src")]),
        "TORCHFLEET_NOW": NOW,
        "TORCHFLEET_PRICES": "offline",
    }
    probe = "import infra, sys; sys.stdout.write(infra.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, env=env, check=True, capture_output=True
    ).stdout.decode()
    if not Path(where).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"plan_diff: {root} imports infra from {where}, not its own copy")
    done = subprocess.run(
        [sys.executable, "-m", "infra.plan", stack, "--prices", "offline", *flags],
        cwd=root,
        env=env,
        capture_output=True,
    )
    out = canonical(done.stdout, "--json" in flags, root)
    return b"exit %d\n" % done.returncode + out + done.stderr


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from infra.stacks import ALL_STACKS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", nargs="?", default="main", help="a commit (default: main)")
    parser.add_argument("head", nargs="?", help="a commit (default: the working tree)")
    args = parser.parse_args(argv)
    base, head = tree(args.base), tree(args.head)
    differing = 0
    for stack in ALL_STACKS:
        for flags in ((), ("--json",)):
            name = " ".join([stack, *flags])
            old, new = render(base, stack, *flags), render(head, stack, *flags)
            if old == new:
                print(f"same   {name}: {len(new)} bytes")
                continue
            differing += 1
            print(f"DIFFER {name}: {len(old)} -> {len(new)} bytes")
            diff = difflib.unified_diff(
                old.decode(errors="replace").splitlines(),
                new.decode(errors="replace").splitlines(),
                args.base,
                args.head or "working tree",
                lineterm="",
            )
            for line in list(diff)[:SHOWN]:
                print(f"  {line}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
