"""`torchfleet rotate-token STACK`: a new API token without a failed request.

Contract. Two steps, each a whole `torchfleet up`, the clients switching between them:
1. `rotate-token STACK`: a new token (infra.edge.TOKEN_LENGTH characters the runtime accepts)
   becomes the stack's `api_token_next`, a Pulumi secret in Pulumi.<stack>.yaml; `up` stores
   "current\\nnext" in the cloud's secret store and the nodes accept both (instances mode: the
   converge re-runs the role's token step; a group's nodes: the inference_runtime role's timer
   re-reads the secret every `inference_runtime_api_token_refresh_s`; Kubernetes: kubelet swaps
   the mounted Secret). The runtime re-reads its token file when it changes: no node restarts.
   The step ends when the endpoint has accepted the next token `STREAK` times in a row and, for
   a group, one refresh interval (and the runtime's recheck) has passed since `up`: every
   running node has read the secret by then. Otherwise it fails, naming what answered.
2. `rotate-token STACK --finish`, once every client sends the next token: refused unless the
   endpoint accepts the next token `STREAK` times in a row now (removing the current token
   from nodes that lack the next would lock every client out); then it becomes `api_token` and
   `api_token_next` is removed; `up` again, and the old token is refused (a group's nodes within
   one refresh interval).
The token is never printed: `pulumi config get torchfleet:api_token_next` shows it.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from typing import Any

from pulumi import automation as auto

from infra import edge, lifecycle
from infra.config import StackConfig
from infra.constants import PROJECT
from infra.deploy import automation
from infra.deploy.progress import Console
from infra.deploy.stage import StageError

NEXT, CURRENT = f"{PROJECT}:api_token_next", f"{PROJECT}:api_token"
# Consecutive acceptances through the endpoint that count as "the nodes accept it": a load
# balancer spreads them over its healthy nodes, so one refusing node breaks the streak.
STREAK = 20
# Well past a group's refresh interval: a node that has not read the secret by then is broken.
ACCEPT_TIMEOUT_S = 600.0
PROBE_PAUSE_S = 1.0  # between two probes after a refusal
RUNTIME_RECHECK_S = 2.0  # the runtime looks at its token file at most once a second

# One GET through the endpoint with the given token: the status, None when nothing answered.
Probe = Callable[[str], int | None]


def new_token() -> str:
    return secrets.token_urlsafe(edge.TOKEN_LENGTH * 3 // 4)  # 4 characters per 3 bytes


def refresh_s(stack: str, cfg: StackConfig | None) -> float:
    """How long a running node may take to read a changed secret: a group's nodes re-read it on
    the role's timer; instances mode converges it during `up`."""
    if cfg is None or cfg.mode != "group":
        return 0.0
    return float(lifecycle.node_setting(stack, "inference_runtime_api_token_refresh_s"))


def wait_accepted(
    probe: Probe,
    token: str,
    timeout_s: float,
    not_before_s: float = 0.0,
) -> int:
    """Probe until `STREAK` acceptances in a row, and at least `not_before_s` from now; the
    probes sent. Raises StageError with the last answers when `timeout_s` passes first (at
    once, after one refusal, with a timeout of 0)."""
    start = time.monotonic()
    streak = sent = 0
    last: list[int | None] = []
    while True:
        code = probe(token)
        sent += 1
        last = (last + [code])[-5:]
        streak = streak + 1 if code == 200 else 0
        if streak >= STREAK and time.monotonic() - start >= not_before_s:
            return sent
        if streak == 0 or streak >= STREAK:
            if time.monotonic() - start >= timeout_s:
                raise StageError(
                    "readiness",
                    f"the endpoint did not accept the next token {STREAK} times in a row within "
                    f"{timeout_s:.0f} s (last answers: {', '.join(str(c) for c in last)})",
                    fix="a 401 is a node that has not read the secret store: look at "
                    "`systemctl status torchfleet-runtime-api-token` and `journalctl -u "
                    "torchfleet-runtime-api-token` on it; nothing answering: the endpoint is "
                    "unreachable from here",
                )
            time.sleep(PROBE_PAUSE_S)


def rotate(
    stack: str,
    console: Console,
    cfg: StackConfig | None,
    up: Callable[[], Any],
    finish: bool = False,
    opener: Callable[[str], auto.Stack] | None = None,
    probe: Callable[[], contextlib.AbstractContextManager[Probe]] | None = None,
) -> None:
    """One step of the rotation (see the module's contract); `up` runs `torchfleet up`, `probe`
    opens the endpoint's probe (None: nothing is checked, for a stack with no endpoint)."""
    handle = (opener or automation.open_stack)(stack)
    config = handle.get_all_config()
    if not finish:
        if NEXT in config:
            raise StageError(
                "refused",
                f"a rotation of {stack} is under way ({NEXT} is set)",
                fix=f"torchfleet rotate-token {stack} --finish, once clients send the next token",
            )
        token = new_token()
        handle.set_config(NEXT, auto.ConfigValue(token, secret=True))
        console.line(f"{NEXT} set (a secret); `up` makes every node accept it beside the current")
        up()
        refresh = refresh_s(stack, cfg)
        with probe() if probe else contextlib.nullcontext() as check:
            if check is not None:
                console.line(
                    f"\nwaiting until the endpoint accepts the next token {STREAK} times in a row"
                    + (
                        f" and {refresh:.0f} s (the nodes' token refresh) have passed"
                        if refresh
                        else ""
                    )
                )
                sent = wait_accepted(
                    check, token, ACCEPT_TIMEOUT_S, refresh + RUNTIME_RECHECK_S if refresh else 0.0
                )
                console.line(f"  accepted ({sent} request(s))")
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
    token = handle.get_config(NEXT).value
    with probe() if probe else contextlib.nullcontext() as check:
        if check is not None:
            try:
                wait_accepted(check, token, 0.0)
            except StageError as err:
                raise StageError(
                    "refused",
                    f"not finishing the rotation of {stack}: {err.message}; removing the current "
                    "token now would leave the nodes that refuse the next one accepting no token "
                    "the clients send",
                    fix=f"re-run `torchfleet up {stack}` (it writes both tokens to the secret "
                    f"store), wait for the nodes to read them, then --finish again",
                ) from None
            console.line(f"the endpoint accepts the next token ({STREAK} times in a row)")
    handle.set_config(CURRENT, auto.ConfigValue(token, secret=True))
    handle.remove_config(NEXT)
    console.line(f"{CURRENT} is the former next token; {NEXT} removed")
    up()
    refresh = refresh_s(stack, cfg)
    console.line(
        "\nthe rotation is finished: the nodes refuse the old token"
        + (f" (a group's nodes within {refresh:.0f} s, their token refresh)" if refresh else "")
    )
