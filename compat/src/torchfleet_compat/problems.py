"""One sentence for every bad input, collected in one pass.

Contract. Every reader of settings (the version matrix's schema, the preflight role's inputs,
the runtime's config, infra's stack config and its kubernetes block) reports a bad value with
`Problems.add(key, value, allowed)`, keeps reading, and raises once at the end
(`raise_if_any`), so one run names every problem. Each problem is the same sentence:

    [<where>: ]<key> = <value!r> is invalid[ (<why>)]; allowed: <what is allowed>

`where` is the source when the reader knows it (a file, `env TORCHFLEET_PORT`, `flag --port`);
`why` is what went wrong when "invalid" alone would not say (a value that does not parse).
`InvalidInput` carries the sentences (`.problems`); each reader's error class derives from it.

Standard library only, Python 3.8+: it runs on bare nodes inside the preflight module. pydantic
was the alternative. Not chosen: the preflight runs before anything is installed, so a bare node
has no pydantic, and one validator for every reader must be stdlib; pydantic's messages name the
field and the input but not our words for what is allowed or where a value came from, which a
wrapper of this module's size would add back; its 2.11+ releases need Python 3.9 (nodes run
3.8); and importing it costs more than the runtime's whole settings contract (the commit that
made the runtime use this module records the measurement).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

# The value of a key that should be there and is not.
MISSING = "(missing)"


def sentence(key: str, value: Any, allowed: str, where: str = "", why: str = "") -> str:
    """The one sentence: `[where: ]key = value is invalid[ (why)]; allowed: what`."""
    head = f"{where}: " if where else ""
    reason = f" ({why})" if why else ""
    return f"{head}{key} = {value!r} is invalid{reason}; allowed: {allowed}"


class InvalidInput(ValueError):
    """Every problem of one input, one sentence each; `heading` (a class attribute, optional)
    leads them as a bulleted list."""

    heading = ""

    def __init__(self, problems: str | Sequence[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if self.heading:
            super().__init__(self.heading + "\n  - " + "\n  - ".join(self.problems))
        else:
            super().__init__("\n".join(self.problems))


class Problems:
    """Collects problems instead of stopping at the first. `where`: the source every problem
    of this input comes from (a file name), unless `add` names another."""

    def __init__(self, where: str = ""):
        self.where = where
        self.problems: list[str] = []

    def add(
        self, key: str, value: Any, allowed: str, where: str | None = None, why: str = ""
    ) -> None:
        self.problems.append(
            sentence(key, value, allowed, self.where if where is None else where, why)
        )

    def __len__(self) -> int:
        return len(self.problems)

    def __iter__(self) -> Iterator[str]:
        return iter(self.problems)

    def raise_if_any(self, error: Callable[[list[str]], Exception] = InvalidInput) -> None:
        """Raise `error(problems)` when anything was collected."""
        if self.problems:
            raise error(list(self.problems))
