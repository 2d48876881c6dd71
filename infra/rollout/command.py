"""`torchfleet rollout`: the command's arguments, turned into an engine run or a control.

    torchfleet rollout STACK --model LOCATION@sha256:HEX [--strategy canary|linear|all-at-once|ab|shadow]
                       [--steps 10,50,100] [--bake 5m] [--window 30s] [--guard KEY=VALUE ...]
                       [--prometheus URL [--selector 'stack="local"']] [--fleet DIR]
    torchfleet rollout status|pause|resume|abort|rollback STACK [--fleet DIR]

The local fleet is the one built here: its description and the rollout's record live in
`--fleet DIR` (default .cache/fleet/STACK, written by whoever starts the fleet: fleet.json). A
cloud stack's traffic split is not built yet: its rollout stops with that said, nothing moved.
Exit codes: 0 promoted (or the control was done), 2 bad arguments or settings, 10 rolled back or
aborted.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchfleet_compat.problems import InvalidInput

from infra.deploy import stage
from infra.matrix import REPO_ROOT
from infra.rollout.engine import Options, Rollout, RolloutError
from infra.rollout.local import LocalFleet, SwitchError
from infra.rollout.policy import AB, STRATEGIES, guard_settings, parse_duration
from infra.rollout.ref import ModelRef, RefError
from infra.rollout.signals import PrometheusSource, ScrapeSource, SignalError
from infra.rollout.state import ACTIVE, engine_alive

ACTIONS = ("status", "pause", "resume", "abort", "rollback")
FLEETS = REPO_ROOT / ".cache" / "fleet"


def add_parser(sub: Any, stack_help: str) -> None:
    p = sub.add_parser(
        "rollout",
        help="roll a model out by canary steps with guards that roll back (local fleet)",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "words",
        nargs="+",
        metavar="[ACTION] STACK",
        help=f"{stack_help}; ACTION: " + ", ".join(ACTIONS),
    )
    p.add_argument("--model", help="LOCATION@sha256:<64 hex> (sha256sum FILE)")
    p.add_argument(
        "--strategy",
        default="canary",
        choices=[*STRATEGIES, AB, "shadow"],
        help="ab: hold --steps PERCENT (an A/B) until `rollout abort` or a guard fires; "
        "shadow: the candidate beside the serving model on every node, compared, never answering",
    )
    p.add_argument(
        "--steps",
        help="traffic percents, increasing, ending at 100 (e.g. 10,50,100); ab: one, 1-99",
    )
    p.add_argument("--bake", default="5m", help="how long each step is watched (default 5m)")
    p.add_argument("--window", default="30s", help="one evaluation window (default 30s)")
    p.add_argument(
        "--guard",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a guard threshold: max_error_ratio_increase, max_p99_ratio, "
        "min_p99_increase_s, min_requests, min_shadow_agreement",
    )
    p.add_argument("--prometheus", help="the stack's Prometheus (default: the nodes' /metrics)")
    p.add_argument("--selector", default="", help="PromQL label matchers of the stack's series")
    p.add_argument(
        "--fleet", type=Path, help="the local fleet's folder (default .cache/fleet/STACK)"
    )


def run(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    words = list(args.words)
    action = words.pop(0) if words[0] in ACTIONS else "start"
    if len(words) != 1:
        say(
            "usage: torchfleet rollout [ACTION] STACK ...: one stack, ACTION one of "
            + ", ".join(ACTIONS)
        )
        return stage.EXIT_USAGE
    stack = words[0]
    try:
        fleet = LocalFleet.load(args.fleet or FLEETS / stack)
    except SwitchError as exc:
        say(
            f"rollout {stack}: {exc}; a cloud stack's traffic split (target groups, backend "
            "weights) is not built yet, so nothing was changed"
        )
        return stage.EXIT_USAGE
    try:
        if action == "start":
            return _start(args, stack, fleet, say)
        return _control(action, fleet, say)
    except (InvalidInput, RefError, RolloutError, SignalError) as exc:
        say(f"rollout {stack}: {exc}")
        return stage.EXIT_USAGE


def _options(args: argparse.Namespace) -> Options:
    raw = {}
    for item in args.guard:
        key, _, value = item.partition("=")
        raw[key.strip()] = value.strip()
    return Options(
        strategy="canary" if args.strategy == "shadow" else args.strategy,
        steps=args.steps,
        # an A/B holds its split: its one step never ends on its own
        bake_s=math.inf if args.strategy == AB else parse_duration("--bake", args.bake),
        window_s=parse_duration("--window", args.window),
        guards=guard_settings(raw, where="--guard"),
    )


def _start(
    args: argparse.Namespace, stack: str, fleet: LocalFleet, say: Callable[[str], None]
) -> int:
    if not args.model:
        say("rollout: --model LOCATION@sha256:<hex> is required to start a rollout")
        return stage.EXIT_USAGE
    ref = ModelRef.parse(args.model)
    options = _options(args)
    source: PrometheusSource | ScrapeSource = (
        PrometheusSource(args.prometheus, args.selector)
        if args.prometheus
        else ScrapeSource(fleet.urls, fleet.auth)
    )
    engine = Rollout(fleet, fleet.state(), fleet.store(), source, options, say)
    if args.strategy == "shadow":
        counts = source.shadow
        return stage.EXIT_OK if engine.shadow(ref, counts) == "agrees" else stage.EXIT_ROLLED_BACK
    result = engine.start(ref)
    return stage.EXIT_OK if result == "promoted" else stage.EXIT_ROLLED_BACK


def _control(action: str, fleet: LocalFleet, say: Callable[[str], None]) -> int:
    state = fleet.state()
    doc = state.read()
    if action == "status":
        for line in status_lines(doc):
            say(line)
        return stage.EXIT_OK
    engine = Rollout(
        fleet, state, fleet.store(), ScrapeSource(fleet.urls, fleet.auth), Options(), say
    )
    active = doc["status"] in ACTIVE and engine_alive(doc)
    if action == "rollback" or (action == "abort" and not active):
        engine.revert()
        return stage.EXIT_OK
    if not active:
        raise RolloutError(f"no rollout is running (status {doc['status']})")
    state.update(lambda d: d.update(control=action))
    say(f"asked the running rollout (pid {doc['pid']}) to {action}; it acts between windows")
    return stage.EXIT_OK


def status_lines(doc: dict[str, Any]) -> list[str]:
    def v(x: dict[str, Any] | None) -> str:
        return "-" if x is None else f"{x['version']} ({x['sha256'][:12]})"

    lines = [
        f"status {doc['status']}"
        + (f", step {doc.get('step')} at {doc.get('share')} %" if doc["status"] in ACTIVE else ""),
        f"stable {v(doc['stable'])}, candidate {v(doc['candidate'])}, previous {v(doc['previous'])}",
    ]
    for e in doc.get("timeline", [])[-10:]:
        lines.append("  " + json.dumps(e, sort_keys=True))
    return lines
