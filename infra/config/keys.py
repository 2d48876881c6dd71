"""How a `torchfleet:` key is declared: once, as the field of a section's record.

A section (infra/config/fleet.py, image.py, network.py, operations.py, kubernetes.py and
rollout.py) is a frozen dataclass; each field that a stack file sets is declared with `key(...)`,
which carries everything about it in one place: the field's name and type (the record), the
YAML kind, the default, what is allowed and the one-line doc (the table in
docs/configuration.md and the default wording of its errors), its sub-keys, and the parser that
turns the raw value into the field's value. `declared(section)` reads the declarations back in
the section's order; the loader (infra/config/loader.py) runs the parsers in that order and
builds the StackConfig.

Rules between keys that no single parser owns are plain functions (infra/config/checks.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

REQUIRED = object()  # a key with no default: the stack must set it

# A parser: (the reader, the values read so far by field name, with `stack` and `matrix`) ->
# the field's value, or None after recording its problems on the reader.
Parser = Callable[[Any, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Key:
    """One `torchfleet:` key of a stack file: its YAML kind, its default (a value, REQUIRED, or
    `derived` words for a default computed from other keys), what is allowed (the words the
    docs show; the parser's own errors say the same where they know no more), its sub-keys for
    structured values, a one-line doc, and its parser. `name` is the key in the stack file (the
    record field's name unless it differs); `field` the record field it fills (empty: none of its
    own, the parser of the key it belongs to reads it: `gpu` for `instance_type`)."""

    kind: str
    doc: str
    allowed: str
    default: Any = None
    derived: str = ""
    subkeys: tuple[str, ...] = ()
    parse: Parser | None = None
    name: str = ""
    field: str = ""
    fatal: bool = False  # nothing after it means anything without it: a problem stops the pass

    @property
    def default_text(self) -> str:
        if self.derived:
            return self.derived
        if self.default is REQUIRED:
            return "required"
        return "unset" if self.default is None else json.dumps(self.default)


def key(
    kind: str,
    doc: str,
    allowed: str,
    default: Any = None,
    *,
    parse: Parser,
    derived: str = "",
    subkeys: tuple[str, ...] = (),
    name: str = "",
    alternative: Key | None = None,
    secret: bool = False,
    fatal: bool = False,
) -> Any:
    """A section field declared as a stack key (see Key). `alternative`: a second key that sets
    the same field (read by this key's parser), listed right after it; `secret`: kept out of the
    record's repr; `fatal`: see Key."""
    decl = Key(kind, doc, allowed, default, derived, subkeys, parse, name, fatal=fatal)
    return field(metadata={"key": decl, "alternative": alternative}, repr=not secret)


def declared(section: type) -> dict[str, Key]:
    """The keys a section's fields declare, by key name, in the section's order."""
    assert is_dataclass(section), section
    out: dict[str, Key] = {}
    for f in fields(section):
        decl = f.metadata.get("key")
        if decl is None:
            continue
        out[decl.name or f.name] = replace(decl, name=decl.name or f.name, field=f.name)
        alternative = f.metadata.get("alternative")
        if alternative is not None:
            out[alternative.name] = alternative
    return out


def subkeys_of(record: type, *switches: str) -> tuple[str, ...]:
    """A block's sub-keys: `switches` (an `enabled` that is not kept) and the record's fields."""
    return (*switches, *(f.name for f in fields(record)))
