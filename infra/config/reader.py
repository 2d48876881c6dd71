"""The reader every parser records its problems on (torchfleet_compat's collector and sentence:
key, value, what is allowed), so one pass reports every bad value instead of the first.

It knows the declarations (infra/config/keys.py) it reads for: a key's default, its kind, its
sub-keys and the `allowed` words a problem quotes when the check has none of its own.
infra/edge.py and infra/k8s/settings.py take it duck-typed (they import nothing from here).
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from torchfleet_compat.problems import InvalidInput, Problems

from infra.config.keys import REQUIRED, Key, default_of, sub_declared
from infra.constants import PROJECT

NAMESPACE = PROJECT  # Pulumi namespaces a project's config keys by the project name
MIN_CIDR_PREFIX = 8  # anything wider is "the internet" for our purposes


class ConfigError(InvalidInput):
    """Every problem found in one pass, one line each."""

    heading = "invalid stack configuration:"


class Reader(Problems):
    """Reads raw values, records problems instead of stopping at the first."""

    def __init__(self, raw: Mapping[str, Any], keys: Mapping[str, Key]):
        super().__init__()
        self.raw = raw
        self.keys = keys

    def fail(self, key: str, value: Any, allowed: str | None = None) -> None:
        """One problem: the key, the value and what is allowed (by default the key's declared
        `allowed`; a check passes its own words only where it knows more, e.g. the zones of this
        region)."""
        if allowed is None:
            allowed = self.keys[key].allowed
        self.add(f"{NAMESPACE}:{key}", value, allowed)

    def kinds(self) -> bool:
        """Every key that is set against its declared YAML kind, before any check reads it (a
        mapping where a string belongs must not reach a lookup). True when all match."""
        ok = True
        for key, value in self.raw.items():
            decl = self.keys.get(key)
            if decl is not None and value is not None and not _has_kind(decl.kind, value):
                self.fail(key, value, f"a YAML {decl.kind}: {decl.allowed}")
                ok = False
        return ok

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value; unset, `default`, else the key's declared default."""
        decl = self.keys.get(key)
        if (
            default is None
            and decl is not None
            and not decl.derived
            and decl.default is not REQUIRED
        ):
            default = decl.default
        return self.raw.get(key, default)

    def structured(self, key: str, kind: type) -> Any:
        value = self.raw.get(key)
        if isinstance(value, str) and kind is not str:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                self.fail(key, value, f"a YAML {kind.__name__}")
                return None
        if value is not None and not isinstance(value, kind):
            self.fail(key, value, f"a YAML {kind.__name__}")
            return None
        decl = self.keys.get(key)
        if isinstance(value, dict) and decl is not None and decl.subkeys:
            for sub in value:
                if sub not in decl.subkeys:
                    self.fail(f"{key}.{sub}", value[sub], f"the keys {', '.join(decl.subkeys)}")
        return value

    def block(
        self, key: str, raw: Mapping[str, Any], got: Mapping[str, Any]
    ) -> tuple[dict[str, Any], set[str]]:
        """A block's sub-keys (its declaration's switch and record, infra/config/keys.py), each
        read from `raw` by its declared reader, unset: its default (REQUIRED and unset: a
        problem). Returns the values by field name (`enabled` for the switch; None where unset
        without a default, or bad) and the names whose values were bad."""
        values: dict[str, Any] = {}
        bad: set[str] = set()
        for name, decl in sub_declared(self.keys[key]).items():
            default = default_of(decl, got, values)
            value = raw.get(name, default)
            if value is REQUIRED or (value is None and default in (None, REQUIRED)):
                if default is REQUIRED:
                    self.fail(decl.name, None)
                    bad.add(name)
                values[decl.field or name] = None  # unset, no default: None
                continue
            assert decl.read is not None, decl.name
            values[decl.field or name] = decl.read(self, decl.name, value, got)
            if values[decl.field or name] is None:
                bad.add(name)
        return values, bad

    def choice(self, key: str, value: Any, allowed: tuple[str, ...]) -> str | None:
        if value not in allowed:
            self.fail(key, value, " | ".join(allowed))
            return None
        return value

    def number(
        self,
        key: str,
        value: Any,
        kind: Callable[[Any], Any],
        lo: float | None,
        hi: float | None,
        what: str | None = None,
    ) -> Any:
        try:
            if isinstance(value, bool):
                raise ValueError
            number = kind(value)
            if kind is int and float(value) != number:
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            self.fail(key, value, what)
            return None
        if not math.isfinite(number):  # NaN passes every comparison below; inf is no quantity
            self.fail(key, value, what)
            return None
        if (lo is not None and number < lo) or (hi is not None and number > hi):
            self.fail(key, value, what)
            return None
        return number

    def boolean(self, key: str, value: Any) -> bool | None:
        """true | false, or the words "true" | "false" in any case."""
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.fail(key, value, "true | false")
        return None

    def cidrs(self, key: str, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.fail(key, value, "a list of CIDRs")
            return ()
        out = []
        for item in value:
            try:
                net = ipaddress.ip_network(str(item), strict=False)
            except ValueError:
                self.fail(key, item, "an IPv4/IPv6 CIDR such as 203.0.113.0/24")
                continue
            if net.prefixlen < MIN_CIDR_PREFIX:
                self.fail(
                    key,
                    item,
                    f"a CIDR of /{MIN_CIDR_PREFIX} or narrower (never the whole "
                    "internet: use a bastion, a VPN or your office range)",
                )
                continue
            out.append(str(net))
        return tuple(out)


def _has_kind(kind: str, value: Any) -> bool:
    """Whether a raw value is of a declared kind. Pulumi hands structured values over as JSON
    text and numbers as text too; the parsers parse them and judge the range."""
    if kind in ("list", "mapping"):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                return False
        return isinstance(value, list if kind == "list" else dict)
    if kind in ("integer", "number"):
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                return False
            return True
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)
