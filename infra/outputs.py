"""What a provider returns, checked where the program relies on it.

Pulumi types many attributes a resource resolves to as optional (`Sequence[...] | None`): a
cloud that answers without them is a provider bug or an API change, and the program should say
which attribute it expected, not fail with `'NoneType' object is not subscriptable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def first(items: Sequence[T] | None, what: str) -> T:
    """The first of `items`, which the cloud always returns at least one of."""
    if not items:
        raise ValueError(f"the provider returned no {what}")
    return items[0]


def present(value: T | None, what: str) -> T:
    """`value`, which the cloud always sets."""
    if value is None:
        raise ValueError(f"the provider returned no {what}")
    return value
