"""The provision stage: Pulumi's Automation API over this repository's program.

`open_stack(stack)` selects (or creates) the stack of the project in the repository root
(Pulumi.yaml, main: infra/) with a `LocalWorkspace`, so the stack's settings come from
Pulumi.<stack>.yaml exactly as with the CLI. `up` / `destroy` stream the engine's events into
`EngineProgress` (one line per finished resource step) and the CLI's own text into the run log
only; `outputs` reads the current outputs. Every failure becomes a `StageError` naming the
resource that failed and the engine's error for it.

The Automation API drives the `pulumi` CLI: run the preflight first (`infra.deploy.preflight`),
which checks for it and for a backend without creating anything. `pulumi up` is idempotent, so
a failed run is continued by running `torchfleet up` again."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pulumi import automation as auto

from infra.deploy.progress import Console, EngineProgress, urn_name
from infra.deploy.stage import StageError
from infra.matrix import REPO_ROOT

SECRET = "[secret]"


@dataclass
class Outputs:
    values: dict[str, Any]
    secret_keys: frozenset[str] = frozenset()

    def masked(self) -> dict[str, Any]:
        """For files and screens: secret outputs replaced by a marker."""
        return {k: SECRET if k in self.secret_keys else v for k, v in self.values.items()}


def plain(outputs: Any) -> Outputs:
    """An Automation API OutputMap (name -> OutputValue) as plain values."""
    return Outputs(
        {k: v.value for k, v in outputs.items()},
        frozenset(k for k, v in outputs.items() if v.secret),
    )


def open_stack(stack: str) -> auto.Stack:
    return auto.create_or_select_stack(stack_name=stack, work_dir=str(REPO_ROOT))


def _select(
    stack: str, opener: Callable[[str], auto.Stack] | None, stage: str = "provision"
) -> auto.Stack:
    try:
        return (opener or open_stack)(stack)
    except auto.CommandError as err:
        raise StageError(
            stage,
            f"selecting (or creating) stack {stack} in the backend failed",
            details=[line for line in str(err).splitlines() if line.strip()][-6:],
            fix="check the backend login (`pulumi whoami`) and the stack name "
            "(`pulumi stack ls`), then re-run",
        ) from err


def _to_log(console: Console) -> Callable[[str], None]:
    """The CLI's own text (what `pulumi up` prints) into the run log, not onto the screen."""
    return lambda text: console.to_log(text.rstrip("\n"))


def _failed(verb: str, stack: str, progress: EngineProgress, err: Exception) -> StageError:
    if isinstance(err, auto.ConcurrentUpdateError):
        return StageError(
            "provision",
            f"another update of stack {stack} is in progress",
            fix=f"wait for it to finish, or `pulumi cancel -s {stack}` if it died, then re-run",
        )
    resource = progress.failures[0] if progress.failures else None
    details = (
        progress.diagnostics[-6:] or [line for line in str(err).splitlines() if line.strip()][-8:]
    )
    what = (
        f"{resource.type} {urn_name(resource.urn)}"
        if resource
        else "the update (no single resource failed)"
    )
    return StageError(
        "provision",
        f"`pulumi {verb}` of stack {stack} failed at {what}",
        task=urn_name(resource.urn) if resource else None,
        details=details,
        fix=f"fix the cause above, then re-run: `pulumi {verb}` continues from the resources "
        "already done (the run log has the engine's full output)",
    )


def up(
    stack: str,
    console: Console,
    opener: Callable[[str], auto.Stack] | None = None,
    env: Mapping[str, str] | None = None,
    target: list[str] | None = None,
) -> Outputs:
    """`env`: variables for the program's process (infra.deploy.capacity's market). `target`:
    the URNs of a targeted update (infra/deploy/split.py), their dependents with them; the
    stack's other resources stay as they are."""
    progress = EngineProgress(console)
    handle = _select(stack, opener)
    if env:
        workspace = handle.workspace
        workspace.env_vars = {**(workspace.env_vars or {}), **env}
    try:
        result = handle.up(
            on_event=progress.on_event,
            on_output=_to_log(console),
            color="never",
            message="torchfleet up" if target is None else "torchfleet rollout: the split",
            target=target,
            target_dependents=True if target is not None else None,
        )
    except auto.CommandError as err:
        raise _failed("up", stack, progress, err) from err
    console.line(f"  {progress.totals()}")
    return plain(result.outputs)


def destroy(
    stack: str, console: Console, opener: Callable[[str], auto.Stack] | None = None
) -> None:
    progress = EngineProgress(console)
    handle = _select(stack, opener, "destroy")
    try:
        handle.destroy(
            on_event=progress.on_event,
            on_output=_to_log(console),
            color="never",
            message="torchfleet down",
        )
    except auto.CommandError as err:
        error = _failed("destroy", stack, progress, err)
        error.stage = "destroy"
        raise error from err
    console.line(f"  {progress.totals()}")


def outputs(stack: str, opener: Callable[[str], auto.Stack] | None = None) -> Outputs:
    try:
        result = (opener or open_stack)(stack).outputs()
    except auto.CommandError as err:
        raise StageError(
            "outputs",
            f"reading the outputs of stack {stack} failed",
            details=str(err).strip().splitlines()[-6:],
            fix=f"`pulumi stack ls` shows the stacks; `torchfleet up {stack}` creates this one",
        ) from err
    if not result:
        raise StageError(
            "outputs", f"stack {stack} has no outputs (has `up` run?)", fix=f"torchfleet up {stack}"
        )
    return plain(result)
