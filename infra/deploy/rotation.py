"""`torchfleet rotate-token STACK`: a new API token without a failed request.

Contract. Two steps, each a whole `torchfleet up`, the clients switching between them:
1. `rotate-token STACK`: a new token (infra.edge.TOKEN_LENGTH characters the runtime accepts)
   becomes the stack's `api_token_next`, a Pulumi secret in Pulumi.<stack>.yaml; `up` stores
   "current\\nnext" in the cloud's secret store and the nodes accept both (instances mode: the
   converge re-runs the role's token step; Kubernetes: kubelet swaps the mounted Secret). The
   runtime re-reads its token file when it changes, so no node restarts.
2. `rotate-token STACK --finish`, once every client sends the next token: it becomes
   `api_token` and `api_token_next` is removed; `up` again, and the old token is refused.
Group mode is refused: its nodes read the token once, at boot (nothing re-reads it yet).
The token is never printed: `pulumi config get torchfleet:api_token_next` shows it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from pulumi import automation as auto

from infra import edge
from infra.config import StackConfig
from infra.constants import PROJECT
from infra.deploy import automation
from infra.deploy.progress import Console
from infra.deploy.stage import StageError

NEXT, CURRENT = f"{PROJECT}:api_token_next", f"{PROJECT}:api_token"


def new_token() -> str:
    return secrets.token_urlsafe(edge.TOKEN_LENGTH * 3 // 4)  # 4 characters per 3 bytes


def _refuse_group(stack: str, cfg: StackConfig | None) -> None:
    if cfg is not None and cfg.mode == "group":
        raise StageError(
            "refused",
            f"{stack} is a group stack: its nodes read the API token at boot only, so a rotation "
            "would refuse the next token on every running node",
            fix="set torchfleet:api_token_next and roll the group (an instance refresh), then "
            "promote it to torchfleet:api_token and roll again",
        )


def rotate(
    stack: str,
    console: Console,
    cfg: StackConfig | None,
    up: Callable[[], Any],
    finish: bool = False,
    opener: Callable[[str], auto.Stack] | None = None,
) -> None:
    """One step of the rotation (see the module's contract); `up` runs `torchfleet up`."""
    _refuse_group(stack, cfg)
    handle = (opener or automation.open_stack)(stack)
    config = handle.get_all_config()
    if not finish:
        if NEXT in config:
            raise StageError(
                "refused",
                f"a rotation of {stack} is under way ({NEXT} is set)",
                fix=f"torchfleet rotate-token {stack} --finish, once clients send the next token",
            )
        handle.set_config(NEXT, auto.ConfigValue(new_token(), secret=True))
        console.line(f"{NEXT} set (a secret); `up` makes every node accept it beside the current")
        up()
        console.line(
            f"\nnodes accept the current and the next token. Switch the clients to the next "
            f"(`pulumi config get {NEXT}`), then: torchfleet rotate-token {stack} --finish"
        )
        return
    if NEXT not in config:
        raise StageError(
            "refused",
            f"no rotation of {stack} to finish ({NEXT} is not set)",
            fix=f"torchfleet rotate-token {stack} starts one",
        )
    handle.set_config(CURRENT, auto.ConfigValue(handle.get_config(NEXT).value, secret=True))
    handle.remove_config(NEXT)
    console.line(f"{CURRENT} is the former next token; {NEXT} removed")
    up()
    console.line("\nthe rotation is finished: the nodes refuse the old token")
