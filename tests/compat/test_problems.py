"""The one problems collector: every reader's sentence, every problem of an input in one pass."""

from __future__ import annotations

import pytest
from torchfleet_compat.problems import MISSING, InvalidInput, Problems, sentence


def test_the_sentence_names_where_key_value_why_and_what_is_allowed():
    assert sentence("port", "http", "1-65535") == "port = 'http' is invalid; allowed: 1-65535"
    assert (
        sentence("port", "http", "an integer 1-65535", "env TORCHFLEET_PORT", "expected an integer")
        == "env TORCHFLEET_PORT: port = 'http' is invalid (expected an integer); "
        "allowed: an integer 1-65535"
    )
    assert sentence("gpus.L4.arch", MISSING, "volta | ada") == (
        "gpus.L4.arch = '(missing)' is invalid; allowed: volta | ada"
    )


def test_problems_are_collected_then_raised_once_with_every_sentence():
    class StackError(InvalidInput):
        heading = "invalid stack configuration:"

    found = Problems(where="m.yml")
    found.raise_if_any(StackError)  # nothing collected: nothing raised
    found.add("a", 1, "2")
    found.add("b", None, "a string", where="flag --b")
    assert len(found) == 2 and list(found) == found.problems
    with pytest.raises(StackError) as err:
        found.raise_if_any(StackError)
    assert err.value.problems == [
        "m.yml: a = 1 is invalid; allowed: 2",
        "flag --b: b = None is invalid; allowed: a string",
    ]
    assert str(err.value) == "invalid stack configuration:\n  - " + "\n  - ".join(
        err.value.problems
    )
    # without a heading, one sentence per line; a single problem may be given as a string
    assert str(InvalidInput(["x", "y"])) == "x\ny"
    assert InvalidInput("x").problems == ["x"]
