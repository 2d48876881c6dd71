"""Every key a stack may set, read from the sections' declarations (infra/config/keys.py), and
docs/configuration.md's table made from them (tests/infra/test_config.py checks it is current)."""

from __future__ import annotations

from infra.config.keys import Key, declared
from infra.config.stack import SECTIONS

FIELDS: dict[str, Key] = {name: decl for s in SECTIONS for name, decl in declared(s).items()}
KEYS = tuple(FIELDS)
# Sub-keys of the structured values, for the same "unknown key" check one level down.
SUBKEYS = {name: decl.subkeys for name, decl in FIELDS.items() if decl.subkeys}


def readme_table() -> str:
    """docs/configuration.md's table of stack keys, from FIELDS."""
    rows = ["| Key | Type | Default | Allowed | What |", "|---|---|---|---|---|"]
    for name, decl in FIELDS.items():
        cells = (
            f"`{name}`" + (" (" + ", ".join(decl.subkeys) + ")" if decl.subkeys else ""),
            decl.kind,
            decl.default_text,
            decl.allowed,
            decl.doc,
        )
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)
