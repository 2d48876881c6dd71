"""`load(raw, stack)`: the raw key/value pairs of a stack file into a StackConfig, or one
ConfigError listing every bad value (key, value, what is allowed).

One pass in the declarations' order (infra/config/table.py): unknown keys and values of the
wrong YAML kind first (nothing reads a value of the wrong kind), then each key's parser with
the values read before it, then the rules between sections (infra/config/checks.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.config.checks import cross_checks
from infra.config.reader import NAMESPACE, ConfigError, Reader
from infra.config.stack import StackConfig
from infra.config.table import FIELDS, KEYS, SUBFIELDS
from infra.matrix import Matrix, load_matrix


def load(raw: Mapping[str, Any], stack: str, matrix: Matrix | None = None) -> StackConfig:
    """Validate `raw` (keys without the `torchfleet:` prefix) for `stack`."""
    r = Reader(raw, {**FIELDS, **SUBFIELDS})
    for name in raw:
        if name not in KEYS:
            r.fail(name, raw[name], f"the keys {', '.join(KEYS)}")
    if not r.kinds():
        raise ConfigError(r.problems)  # the parsers read values of the declared kinds
    got: dict[str, Any] = {"stack": stack, "matrix": matrix or load_matrix()}
    for decl in FIELDS.values():
        if decl.parse is None:
            continue  # read by the parser of the key it belongs to (gpu: instance_type's)
        got[decl.field] = decl.parse(r, got)
        if decl.fatal and got[decl.field] is None:
            raise ConfigError(r.problems)  # nothing after it means anything without it
    cross_checks(r, got)
    if r.problems:
        raise ConfigError(r.problems)
    del got["matrix"]
    return StackConfig(**got)


def raw_from_pulumi_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """Strip the namespace from a flat Pulumi config map; other namespaces are ignored."""
    prefix = NAMESPACE + ":"
    return {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}
