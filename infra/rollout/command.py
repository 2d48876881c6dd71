"""`torchfleet rollout`: the command's arguments, turned into an engine run or a control.

    torchfleet rollout STACK --model LOCATION@sha256:HEX [--strategy canary|linear|all-at-once|ab|shadow]
                       [--steps 10,50,100] [--bake 5m] [--window 30s] [--guard KEY=VALUE ...]
                       [--prometheus URL [--selector 'stack="local"']] [--fleet DIR]
    torchfleet rollout status|pause|resume|abort|rollback STACK [--fleet DIR]

The local fleet is the one built here: its description and the rollout's record live in
`--fleet DIR` (default .cache/fleet/STACK, written by whoever starts the fleet: fleet.json). A
mode: kubernetes stack (no fleet.json) rolls out by its two Deployments, a mode: group stack by
its stable and candidate scaling groups (AWS: two target groups behind a weighted listener;
Alibaba: one VServer group, a weight per group): the split through its `rollout` block and
`torchfleet up` (cloud.py), the files in its model store (tracks.py), the promotion reaching
the running stable nodes (refresh.py: AWS's instance refresh awaited, Alibaba's surge-first
roll), the record in .cache/fleet/STACK. The figures: --prometheus URL when given; else on a
group stack the cloud's per-track metrics (--window 60s at least): AWS, the ALB's per target
group in CloudWatch; Alibaba, the nodes' own in CloudMonitor by scaling group (the CLB's are per
listener). A kubernetes stack needs --prometheus. Instances stacks are refused, nothing moved.
Before the first step a rollout prints what its p99 guard can see at the stable's p99 (the
latency buckets' resolution there) and refuses a max_p99_ratio finer than that.
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

from infra.config import StackConfig
from infra.constants import ROLLOUT_METRICS_OUTPUT
from infra.deploy import automation, preflight, stage
from infra.deploy.stage import StageError
from infra.matrix import REPO_ROOT
from infra.rollout.cloud import TRACKS, CloudSplit
from infra.rollout.clouds import KUBERNETES_LIMIT as KUBERNETES_LIMIT  # the tests read it here
from infra.rollout.clouds import rollout_of
from infra.rollout.engine import Fleet, Options, Rollout
from infra.rollout.errors import RolloutError
from infra.rollout.local import FLEET_FILE, LocalFleet, SwitchError
from infra.rollout.policy import AB, GUARD_RULES, STRATEGIES, guard_settings, parse_duration
from infra.rollout.ref import ModelRef, Store
from infra.rollout.signals import (
    CLOUDWATCH_PERIOD_S,
    PrometheusSource,
    ScrapeSource,
    SignalError,
    Source,
    TrackMetricsSource,
    cloudwatch_period,
)
from infra.rollout.state import ACTIVE, RolloutState, engine_alive
from infra.rollout.tracks import ModelTracks, bundle_model, volume_of

StepOf = Callable[[str, Any, StackConfig], Callable[[Any], Any]]
ACTIONS = ("status", "pause", "resume", "abort", "rollback")
FLEETS = REPO_ROOT / ".cache" / "fleet"
DEFAULT_WINDOW = "30s"
# What the command refuses with its message and exit 2: every part's RolloutError, and a bad
# setting another layer reports (torchfleet_compat.problems.InvalidInput, e.g. infra.config's).
REFUSALS = (RolloutError, InvalidInput)


def add_parser(sub: Any, stack_help: str) -> None:
    p = sub.add_parser(
        "rollout",
        help="roll a model out by canary steps with guards that roll back (local fleet, "
        "mode: kubernetes, mode: group)",
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
    p.add_argument(
        "--window",
        help=f"one evaluation window (default {DEFAULT_WINDOW}; with figures from CloudWatch or "
        f"CloudMonitor {CLOUDWATCH_PERIOD_S}s, its minimum)",
    )
    p.add_argument(
        "--guard",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a guard threshold: " + ", ".join(GUARD_RULES),
    )
    p.add_argument(
        "--prometheus",
        help="the stack's Prometheus (default: the nodes' /metrics on the local fleet, the cloud's "
        "per-track metrics on a group stack; required on a kubernetes stack)",
    )
    p.add_argument("--selector", default="", help="PromQL label matchers of the stack's series")
    p.add_argument(
        "--fleet", type=Path, help="the local fleet's folder (default .cache/fleet/STACK)"
    )


def run(
    args: argparse.Namespace,
    say: Callable[[str], None],
    up_of: Callable[[str], Callable[[], Any]] | None = None,
    step_of: StepOf | None = None,
) -> int:
    """`up_of(stack)`: the `up` a cloud stack's split runs after each config change (the CLI's
    `torchfleet up`); `step_of(stack, handle, cfg)`: a group stack's weight step where its
    cloud's table allows a targeted one (default: infra/deploy/split.py's TargetedStep)."""
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
        return _run(action, args, stack, say, up_of, step_of)
    except REFUSALS as exc:  # the one place a rollout's refusal becomes its message
        say(f"rollout {stack}: {exc}")
        return stage.EXIT_USAGE


def _run(
    action: str,
    args: argparse.Namespace,
    stack: str,
    say: Callable[[str], None],
    up_of: Callable[[str], Callable[[], Any]] | None,
    step_of: StepOf | None,
) -> int:
    if args.fleet is None and not (FLEETS / stack / FLEET_FILE).is_file():
        cfg = preflight.check_config(stack)[1]
        refusal = _not_built(cfg) if cfg is not None else None
        if refusal:
            raise RolloutError(f"{refusal}. Nothing was changed")
        if cfg is not None:
            return _cloud(action, args, stack, cfg, say, up_of, step_of)
    try:
        fleet = LocalFleet.load(args.fleet or FLEETS / stack)
    except SwitchError as exc:
        raise RolloutError(
            f"{exc}; and Pulumi.{stack}.yaml is not a valid mode: kubernetes "
            "stack (`make plan STACK=...` says why), so nothing was changed"
        ) from exc
    source: PrometheusSource | ScrapeSource = (
        PrometheusSource(args.prometheus, args.selector)
        if args.prometheus
        else ScrapeSource(fleet.urls, fleet.auth)
    )
    if action == "start":
        return _start(args, fleet, fleet.state(), fleet.store(), source, say)
    return _control(action, fleet, fleet.state(), fleet.store(), source, say)


class _NoFigures:
    """The source of a control that judges nothing (rollback, abort of a dead engine)."""

    def begin(self) -> None:
        raise SignalError("this control judges no window: run the rollout with --prometheus URL")

    def end(self) -> dict[str, Any]:
        raise SignalError("this control judges no window: run the rollout with --prometheus URL")


def _not_built(cfg: StackConfig) -> str | None:
    """Why `torchfleet rollout` cannot move this cloud stack, or None when it can."""
    if cfg.mode == "instances":
        return (
            f"a stack in mode: instances ({cfg.cloud}) has no load balancer to split at: a "
            "rollout needs mode: group or mode: kubernetes, or the local fleet "
            "(docs/rollouts.md)"
        )
    return None


def _cloud(
    action: str,
    args: argparse.Namespace,
    stack: str,
    cfg: StackConfig,
    say: Callable[[str], None],
    up_of: Callable[[str], Callable[[], Any]] | None,
    step_of: StepOf | None,
) -> int:
    """A cloud stack: its two tracks as the engine's two nodes (cloud.py; kubernetes: the two
    Deployments, group: the stable and candidate Auto Scaling groups), their files switched in
    the model store (tracks.py), the record in .cache/fleet/STACK."""
    folder = FLEETS / stack
    state, store = RolloutState(folder / "rollout.json"), Store(folder / "models")
    if action == "status":
        return _control(action, None, state, store, _NoFigures(), say)
    if action == "start" and args.strategy == "shadow" and cfg.mode != "kubernetes":
        raise RolloutError(
            f"--strategy shadow is not built on mode: {cfg.mode}: a group's nodes take a new file "
            "by being replaced, every node twice for one shadow test (the local fleet and mode: "
            "kubernetes run it; here a canary or an ab split)"
        )
    table = rollout_of(cfg)  # what differs by cloud, looked up once
    # a group stack without --prometheus: its cloud's 1-minute figures per track
    figures = action == "start" and not args.prometheus and cfg.mode == "group"
    kind = table.figures
    needs = table.needs_prometheus(cfg)
    if action == "start" and not args.prometheus and needs:
        raise RolloutError(needs)
    if figures:  # refused before anything is opened: a window the cloud cannot resolve
        args.window = args.window or f"{CLOUDWATCH_PERIOD_S}s"
        window_s = parse_duration("--window", args.window)
        cloudwatch_period(window_s, kind.service)
    volume = volume_of(cfg, folder / "volume")
    handle = automation.open_stack(stack)
    up = up_of(stack) if up_of else _default_up(stack)
    step = None
    if cfg.mode == "kubernetes":
        tracks = ModelTracks(handle, up, volume, say)
    else:
        cache = folder / "bundle-model"
        tracks = ModelTracks(
            handle,
            up,
            volume,
            say,
            stable_default=bundle_model(stack, cache, cfg.region),
            refresh=table.refresh(cfg, say),
        )
        if table.targeted_step:
            step = (step_of or _default_step)(stack, handle, cfg)
    split = CloudSplit(handle, up, tracks, cloud_limit=table.limit(cfg), say=say, step=step)
    source: PrometheusSource | TrackMetricsSource | _NoFigures
    if args.prometheus:
        source = PrometheusSource(args.prometheus, args.selector)
    elif figures:
        source = kind(
            dimensions=lambda: _rollout_metrics(stack, handle),
            versions=lambda: {track: tracks.version(track) for track in TRACKS},
            window_s=window_s,
            region=cfg.region,
        )
        hint = (
            "; the stack's monitoring host has per-version figures without the delay: "
            "--prometheus http://HOST:9090"
            if cfg.monitoring
            else ""
        )
        say(f"rollout {stack}: figures from {source.describe()} (no --prometheus){hint}")
    else:  # a control that judges nothing (status, rollback)
        source = _NoFigures()
    if action == "start":
        return _start(args, split, state, store, source, say)
    return _control(action, split, state, store, source, say)


def _rollout_metrics(stack: str, handle: Any) -> dict[str, Any]:
    """The stack output a TrackMetricsSource reads its dimensions from (infra/aws/edge.py,
    infra/alicloud/fleet.py)."""
    try:
        outputs = automation.outputs(stack, opener=lambda _: handle)
    except StageError as err:
        raise SignalError(f"{err.message}: {err.fix or ''}") from err
    value = outputs.values.get(ROLLOUT_METRICS_OUTPUT)
    if not isinstance(value, dict):
        raise SignalError(
            f"stack {stack} has no output {ROLLOUT_METRICS_OUTPUT} (where each track's figures "
            f"are): `torchfleet up {stack}` exports it, or give --prometheus URL"
        )
    return value


def _default_up(stack: str) -> Callable[[], Any]:
    from infra.deploy import pipeline
    from infra.deploy.progress import Console

    return lambda: pipeline.up(stack, Console())


def _default_step(stack: str, handle: Any, cfg: StackConfig) -> Callable[[Any], Any]:
    from infra.deploy.progress import Console
    from infra.deploy.split import TargetedStep

    return TargetedStep(stack, handle, cfg, Console())


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
        window_s=parse_duration("--window", args.window or DEFAULT_WINDOW),
        guards=guard_settings(raw, where="--guard"),
    )


def _start(
    args: argparse.Namespace,
    fleet: Fleet,
    state: RolloutState,
    store: Store,
    source: Source,
    say: Callable[[str], None],
) -> int:
    if not args.model:
        say("rollout: --model LOCATION@sha256:<hex> is required to start a rollout")
        return stage.EXIT_USAGE
    ref = ModelRef.parse(args.model)
    options = _options(args)
    engine = Rollout(fleet, state, store, source, options, say)
    if args.strategy == "shadow":
        assert isinstance(source, PrometheusSource | ScrapeSource)
        counts = source.shadow
        return stage.EXIT_OK if engine.shadow(ref, counts) == "agrees" else stage.EXIT_ROLLED_BACK
    result = engine.start(ref)
    return stage.EXIT_OK if result == "promoted" else stage.EXIT_ROLLED_BACK


def _control(
    action: str,
    fleet: Fleet | None,
    state: RolloutState,
    store: Store,
    source: Source,
    say: Callable[[str], None],
) -> int:
    doc = state.read()
    if action == "status":
        for line in status_lines(doc):
            say(line)
        return stage.EXIT_OK
    assert fleet is not None
    engine = Rollout(fleet, state, store, source, Options(), say)
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
