"""Pulumi's entry point (`main: infra/` in Pulumi.yaml).

Pulumi executes this file as a script with infra/ first on sys.path, not as the package
`infra`; putting the repository root on sys.path lets the program import its own modules the
same way the offline plan and the tests do."""

import sys
from pathlib import Path

import pulumi

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.config import ConfigError
from infra.program import run

try:
    run()
except ConfigError as err:
    # RunError prints the message alone, without a traceback: it is the user's to fix.
    raise pulumi.RunError(str(err)) from None
