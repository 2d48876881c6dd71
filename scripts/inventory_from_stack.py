#!/usr/bin/env python3
"""Write inventories/<stack>/stack.yml from a stack's `inventory` output.

    scripts/inventory_from_stack.py aws-dev                 # runs `pulumi stack output --json`
    scripts/inventory_from_stack.py aws-dev --input out.json
    pulumi stack output --json -s aws-dev | scripts/inventory_from_stack.py aws-dev --input -

`torchfleet up` does this itself after `pulumi up`; this script is the same step on its own
(infra/deploy/inventory.py). Instances-mode stacks list their hosts with per-host variables.
Group-mode stacks (a scaling group owns the nodes) give the group variables and, in
`all.vars.torchfleet_discovery`, the region and tags that find the group's running nodes, with
the per-host variables an instances-mode host has, through group_nodes.py written next to
stack.yml (an inventory script over infra/group_inventory.py, for either cloud)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.deploy.inventory import InventoryError, hosts_of, inventory_of, read_outputs, write
from infra.matrix import REPO_ROOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("stack")
    parser.add_argument("--input", help="a file with `pulumi stack output --json`, or - for stdin")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "inventories")
    args = parser.parse_args(argv)
    try:
        inv = inventory_of(read_outputs(args.stack, args.input))
    except InventoryError as err:
        print(f"inventory_from_stack: {args.stack}: {err}", file=sys.stderr)
        return 1
    path = write(args.stack, inv, args.out_dir, writer="scripts/inventory_from_stack.py")
    hosts = hosts_of(inv)
    print(
        f"wrote {path} ({len(hosts)} host(s)"
        + (", group mode: nodes found by tag)" if not hosts else ")")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
