"""`torchfleet-runtime check`: is this node able to serve a model on its GPU?

The checklist a person runs by hand on a fresh GPU node, as one command: the distro, Python and
torch against the CUDA profile of compat/matrix.yml, the NVIDIA driver against the minimum for
torch's CUDA, the GPU against the profile, cuDNN, free disk and memory. Output is a table (or
`--json`); the exit status is 1 when any check fails, 2 on a usage problem.

This module is the report: which matrix to read, the table or JSON, and the CLI
(`configure_parser` and `run`, the contract the runtime's cli.py calls). What it reports comes
from the package's one probe (probe.py, `installed=True`) and one judge (judge.py), the same
two the preflight role's module runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from . import matrix as compat
from .judge import Check, Options, judge, summarize
from .matrix import FAIL, WARN, Matrix
from .probe import probe


class CheckError(Exception):
    """A usage problem (no matrix, bad profile): reported as one line, exit status 2."""


DEFAULT_DISK_PATH = "/var/lib/torchfleet"
ETC_MATRIX = "/etc/torchfleet/matrix.yml"


# --------------------------------------------------------------------------- matrix


def find_matrix(explicit: str | None, env: Mapping[str, str] | None = None) -> Path:
    """--matrix, then $TORCHFLEET_MATRIX, then /etc/torchfleet/matrix.yml, then the
    checkout's compat/matrix.yml (walking up from this file). The first two must exist when
    given: a typo should not silently fall through to another matrix."""
    environ: Mapping[str, str] = os.environ if env is None else env
    for source, value in (
        ("--matrix", explicit),
        ("TORCHFLEET_MATRIX", environ.get("TORCHFLEET_MATRIX")),
    ):
        if value:
            path = Path(value)
            if not path.is_file():
                raise CheckError(f"{source} {value}: no such file")
            return path
    if Path(ETC_MATRIX).is_file():
        return Path(ETC_MATRIX)
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "compat" / "matrix.yml"
        if candidate.is_file():
            return candidate
    raise CheckError(
        "no version matrix found: pass --matrix FILE or set TORCHFLEET_MATRIX "
        f"(looked in {ETC_MATRIX} and the checkout's compat/matrix.yml)"
    )


def load_matrix(path: Path) -> Matrix:
    try:
        return compat.read(str(path))
    except compat.MatrixError as exc:
        raise CheckError(str(exc)) from exc


# --------------------------------------------------------------------------- output + CLI


def render_table(checks: Sequence[Check]) -> str:
    headers = ("CHECK", "STATUS", "VALUE", "EXPECTED")
    rows = [(c.name, c.status.upper(), c.value, c.expected) for c in checks]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:3])]
    lines = []
    for row in [headers, *rows]:
        lines.append(
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3]
        )
    for c in checks:
        if c.hint and c.status in (WARN, FAIL):
            lines.append(f"{c.status.upper()}: {c.name}: {c.hint}")
    return "\n".join(line.rstrip() for line in lines)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = "Check this node against the version matrix (exit 1 on a failed check)."
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--matrix",
        metavar="FILE",
        help=f"version matrix (default: $TORCHFLEET_MATRIX, {ETC_MATRIX}, the checkout's "
        "compat/matrix.yml)",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        help="CUDA profile to check against (default: the one matching the installed torch)",
    )
    parser.add_argument(
        "--min-free-disk-gb",
        type=float,
        metavar="N",
        help="free disk required at --path (default: the matrix's min_free_disk_gb)",
    )
    parser.add_argument(
        "--path",
        default=DEFAULT_DISK_PATH,
        help="where models live; its disk is checked (default: %(default)s)",
    )
    parser.add_argument(
        "--require-gpu",
        action="store_true",
        help="fail, instead of skip, the GPU checks on a host without a GPU",
    )


def run(args: argparse.Namespace) -> int:
    try:
        matrix_path = find_matrix(args.matrix)
        matrix = load_matrix(matrix_path)
        if args.min_free_disk_gb is not None and args.min_free_disk_gb < 0:
            raise CheckError(f"--min-free-disk-gb {args.min_free_disk_gb}: must be >= 0")
        facts = probe(args.path, matrix.gpus, installed=True)
        options = Options(
            profile=args.profile,
            min_free_disk_gb=args.min_free_disk_gb,
            require_gpu=args.require_gpu,
        )
        profile, checks = judge(facts, matrix, options)
    except (CheckError, compat.MatrixError) as exc:  # an unknown --profile is a MatrixError
        print(f"torchfleet-runtime check: error: {exc}", file=sys.stderr)
        return 2
    counts = summarize(checks)
    if args.json:
        print(
            json.dumps(
                {
                    "matrix": str(matrix_path),
                    "profile": profile.name,
                    "ok": counts[FAIL] == 0,
                    "summary": counts,
                    "checks": [c.as_dict() for c in checks],
                },
                indent=2,
            )
        )
    else:
        print(f"matrix: {matrix_path}")
        print(render_table(checks))
        print(", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if counts[FAIL] else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchfleet-runtime check")
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
