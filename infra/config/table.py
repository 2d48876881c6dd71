"""Every key a stack may set, read from the sections' declarations (infra/config/keys.py), and
docs/configuration.md's table made from them (tests/infra/test_config.py checks it is current)."""

from __future__ import annotations

from infra.config.keys import Key, declared, sub_declared
from infra.config.stack import SECTIONS

FIELDS: dict[str, Key] = {name: decl for s in SECTIONS for name, decl in declared(s).items()}
KEYS = tuple(FIELDS)
# Sub-keys of the structured values, for the same "unknown key" check one level down.
SUBKEYS = {name: decl.subkeys for name, decl in FIELDS.items() if decl.subkeys}
# The sub-keys declared with `sub(...)`, by path (`spot.max_price_ratio`), in the blocks' order.
SUBFIELDS: dict[str, Key] = {
    decl.name: decl
    for block in FIELDS.values()
    if block.record is not None
    for decl in sub_declared(block).values()
}


def readme_table() -> str:
    """docs/configuration.md's table of stack keys, from FIELDS: each key, then each of its
    declared sub-keys (a row of its own, by path)."""
    rows = ["| Key | Type | Default | Allowed | What |", "|---|---|---|---|---|"]
    for name, decl in FIELDS.items():
        listed = decl.subkeys if decl.subkeys and decl.record is None else ()
        rows.append(_row(f"`{name}`" + (" (" + ", ".join(listed) + ")" if listed else ""), decl))
        if decl.record is not None:
            rows += [_row(f"`{sub.name}`", sub) for sub in sub_declared(decl).values()]
    return "\n".join(rows)


def _row(name: str, decl: Key) -> str:
    cells = (name, decl.kind, decl.default_text, decl.allowed, decl.doc)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
