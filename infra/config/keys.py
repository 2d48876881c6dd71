"""How a `torchfleet:` key is declared: once, as the field of a section's record.

A section (infra/config/fleet.py, image.py, network.py, operations.py, kubernetes.py and
rollout.py) is a frozen dataclass; each field that a stack file sets is declared with `key(...)`,
which carries everything about it in one place: the field's name and type (the record), the
YAML kind, the default, what is allowed and the one-line doc (the table in
docs/configuration.md and the default wording of its errors), its sub-keys, and the parser that
turns the raw value into the field's value. `declared(section)` reads the declarations back in
the section's order; the loader (infra/config/loader.py) runs the parsers in that order and
builds the StackConfig.

A block's sub-keys (`spot.max_price_ratio`, `scaling.launch_timeout_s`, ...) are declared the
same way, with `sub(...)`, as the fields of the block's record (Spot, Scaling, ...): type,
default, allowed words, doc line and a reader of the one value. `key(..., record=Spot)` names
the record, from which the block's sub-keys, their rows in the docs' table and the generic block
reader (infra/config/reader.py `Reader.block`) come; the block's parser keeps only the rules
between its sub-keys and the keys before it.

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
# A sub-key's reader: (the reader, the key's path such as `spot.fallback`, its raw value, the
# values read so far by field name) -> the value, or None after recording its problem (with no
# words of its own, the problem quotes the sub-key's declared `allowed`).
SubParser = Callable[[Any, str, Any, Mapping[str, Any]], Any]


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
    record: type | None = None  # a block's record: its `sub(...)` fields are the sub-keys
    switch: Key | None = None  # a block's `enabled` that the record does not keep
    read: SubParser | None = None  # a sub-key's reader of its one value (instead of parse)

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
    record: type | None = None,
    switch: Key | None = None,
) -> Any:
    """A section field declared as a stack key (see Key). `alternative`: a second key that sets
    the same field (read by this key's parser), listed right after it; `secret`: kept out of the
    record's repr; `fatal`: see Key; `record` (and `switch`): a block whose sub-keys are the
    record's `sub(...)` fields (and the switch's `enabled`)."""
    if record is not None:  # allowed: the sub-keys (each with its own row), then any words
        subkeys = (*((switch.name,) if switch else ()), *(f.name for f in fields(record)))
        allowed = "; ".join(filter(None, ("the sub-keys " + ", ".join(subkeys), allowed)))
    decl = Key(
        kind,
        doc,
        allowed,
        default,
        derived,
        subkeys,
        parse,
        name,
        fatal=fatal,
        record=record,
        switch=switch,
    )
    return field(metadata={"key": decl, "alternative": alternative}, repr=not secret)


def sub(
    kind: str,
    doc: str,
    allowed: str,
    default: Any = None,
    *,
    read: SubParser,
    derived: str = "",
    name: str = "",
) -> Any:
    """A block record's field declared as a sub-key (see Key): `default` is a value (also the
    record field's default), REQUIRED, or a function of (the values read so far, the block's
    sub-keys read so far) with `derived` words for the docs; `read` judges one value."""
    decl = Key(kind, doc, allowed, default, derived, name=name, read=read)
    meta = {"key": decl}
    if default is REQUIRED or callable(default):
        return field(metadata=meta)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def switch(doc: str, default: bool) -> Key:
    """A block's `enabled` sub-key: true or false, not kept in the block's record."""
    return Key("boolean", doc, "true | false", default, name="enabled", read=flag)


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


def sub_declared(block: Key) -> dict[str, Key]:
    """A block's sub-keys (its switch first, then its record's fields), by name, each named by
    its path (`spot.max_price_ratio`) and the record field it fills."""
    assert block.record is not None, block.name
    out = {}
    if block.switch is not None:
        out[block.switch.name] = replace(block.switch, name=f"{block.name}.{block.switch.name}")
    for f in fields(block.record):
        decl = f.metadata["key"]
        out[f.name] = replace(decl, name=f"{block.name}.{decl.name or f.name}", field=f.name)
    return out


def default_of(decl: Key, got: Mapping[str, Any], subs: Mapping[str, Any]) -> Any:
    """A sub-key's default for this stack: its value, or what its function gives."""
    return decl.default(got, subs) if callable(decl.default) else decl.default


# Readers of one sub-key's value (`sub(..., read=...)` above); a problem quotes the sub-key's
# declared `allowed`. Each takes the reader (infra/config/reader.py) duck-typed.
def integer(lo: float | None, hi: float | None) -> Callable[..., Any]:
    """An integer in lo..hi (None: no bound)."""
    return lambda r, path, value, got: r.number(path, value, int, lo, hi)


def real(lo: float | None, hi: float | None) -> Callable[..., Any]:
    """A number in lo..hi (None: no bound)."""
    return lambda r, path, value, got: r.number(path, value, float, lo, hi)


def flag(r: Any, path: str, value: Any, got: Mapping[str, Any]) -> bool | None:
    """true | false."""
    return r.boolean(path, value)


def one_of(allowed: tuple[str, ...]) -> Callable[..., Any]:
    """One of `allowed`."""
    return lambda r, path, value, got: r.choice(path, value, allowed)
