"""Write (or, with --check, verify) the role's generated artifacts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from roles.monitoring.generator import dashboard, prices

ROLE = Path(__file__).resolve().parents[1]
DASHBOARD = ROLE / "files" / "dashboards" / "torchfleet.json"
PRICES = ROLE / "files" / "rules" / "torchfleet-prices.rules.yml"


class _IndentedDumper(yaml.SafeDumper):
    """Indents list items under their key, as yamllint (ansible-lint) expects."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def artifacts() -> dict[Path, str]:
    return {
        DASHBOARD: dashboard.render_json(),
        PRICES: prices.HEADER
        + yaml.dump(prices.price_rules(), Dumper=_IndentedDumper, sort_keys=False, width=120),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m roles.monitoring.generator",
        description="Generate the monitoring role's dashboard and price rules.",
    )
    parser.add_argument(
        "--check", action="store_true", help="fail if a committed artifact is stale"
    )
    args = parser.parse_args(argv)
    stale = []
    for path, text in artifacts().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROLE.parents[1])}")
    for path in stale:
        print(
            f"stale: {path.relative_to(ROLE.parents[1])} (run python -m roles.monitoring.generator)",
            file=sys.stderr,
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
