"""`torchfleet`: one command per job.

    torchfleet up STACK       preflight -> pulumi up -> inventory -> site.yml + verify.yml ->
                              readiness -> one prediction -> summary
    torchfleet down STACK     pulumi destroy (nodes, network, schedules, TTL, budget); a prod
                              stack only with --yes
    torchfleet status STACK   outputs, per-node readiness and batch cap, TTL left, cost per hour
    torchfleet plan STACK     the plan under the mock engine: resource tree and cost
    torchfleet cost STACK     the measured spend (the cloud's bill, by the stack tag) beside the
                              estimate for the same days
    torchfleet demo           `up` on this machine with containers as nodes (make demo)
    torchfleet rotate-token STACK [--finish]   a new API token, accepted beside the current
                              until --finish (infra/deploy/rotation.py)
    torchfleet rollout STACK --model REF   canary/linear steps with guards that roll back
                              (rollout status|pause|resume|abort|rollback STACK)

The stages, their output and the exit codes are in infra/deploy/ (stage.py lists the codes)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager

from infra.deploy import stage
from infra.deploy.progress import Console
from infra.deploy.stage import StageError
from infra.stacks import STACKS

EPILOG = """exit codes:
  0 success                       6 converge: site.yml/verify.yml failed on a host
  1 unexpected error (a bug)      7 readiness: a node (or the group) never became ready
  2 usage                         8 smoke: the prediction through the endpoint failed
  3 preflight: something missing,   9 refused: a prod stack without --yes
    nothing created               130 interrupted
  4 provision: pulumi up/destroy failed
  5 inventory: the outputs are not a torchfleet inventory  10 rollout: rolled back (a guard fired)

Every stage is idempotent: after fixing what a failure names, run the same command again.
Each run keeps its log and ansible-runner's artifacts in .cache/runs/<stack>/<timestamp>/."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchfleet",
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show Ansible's and the engine's full output",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    stack_help = f"the stack: {', '.join(STACKS)} (Pulumi.<stack>.yaml)"

    up = sub.add_parser("up", help="deploy a stack and leave it serving")
    up.add_argument("stack", help=stack_help)
    up.add_argument(
        "--ssh-key",
        help="private key for the nodes (default: the one of "
        "~/.ssh/ or ssh-agent that matches torchfleet:ssh_public_key)",
    )
    up.add_argument(
        "--skip-provision",
        action="store_true",
        help="use the stack's current outputs instead of running pulumi up",
    )
    up.add_argument(
        "--ready-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait for every node's /readyz (default 900), or on a kubernetes stack "
        "for the Deployment's replicas and the load balancer's address (default 1500)",
    )

    down = sub.add_parser("down", help="destroy a stack")
    down.add_argument("stack", help=stack_help)
    down.add_argument("--yes", action="store_true", help="required for a prod stack")

    status = sub.add_parser("status", help="what a stack runs and costs now")
    status.add_argument("stack", help=stack_help)
    status.add_argument("--ssh-key", help="private key for the nodes (as for up)")

    cost = sub.add_parser("cost", help="what a stack has cost (the bill) beside its estimate")
    cost.add_argument("stack", help=stack_help)
    cost.add_argument(
        "--since",
        default="7d",
        metavar="N{d,w}",
        help="the last N whole days (d) or weeks (w) before today, UTC (default 7d)",
    )

    plan = sub.add_parser(
        "plan",
        help="the plan and cost under the mock engine, nothing created (prices: the cloud's "
        "price API when credentials are present, as python -m infra.plan --prices auto)",
    )
    plan.add_argument("stack", nargs="+", help=stack_help)
    plan.add_argument("--json", action="store_true", help="outputs and resources as JSON")

    rotate = sub.add_parser(
        "rotate-token", help="a new API token without a failed request (two steps)"
    )
    rotate.add_argument("stack", help=stack_help)
    rotate.add_argument(
        "--finish",
        action="store_true",
        help="the next token becomes the only one (once every client sends it)",
    )
    rotate.add_argument("--ssh-key", help="private key for the nodes (as for up)")

    demo = sub.add_parser("demo", help="`up` with local containers as nodes (no cloud, no GPU)")
    demo.add_argument(
        "--nodes",
        type=int,
        default=int(os.environ.get("NODES") or 1),
        choices=range(1, 5),
        metavar="N",
        help="container nodes, 1-4 (env NODES)",
    )
    demo.add_argument(
        "--clean",
        action="store_true",
        help="remove the demo's containers, keys, inventory and run logs",
    )
    demo.add_argument("--no-bench", action="store_true", help="skip the short benchmark")
    demo.add_argument("--no-plan", action="store_true", help="skip the offline plan")

    from infra.rollout import command as rollout

    rollout.add_parser(sub, stack_help)
    return parser


def _print_summary(console: Console, lines: list[str]) -> None:
    console.line("")
    for line in lines:
        console.line(line)


def _dispatch(args: argparse.Namespace, console: Console) -> int:
    from infra.deploy import pipeline

    if args.command == "plan":
        from infra import plan

        return plan.main([*args.stack, *(["--json"] if args.json else [])])
    if args.command == "up":
        summary = pipeline.up(
            args.stack,
            console,
            ssh_key=args.ssh_key,
            skip_provision=args.skip_provision,
            ready_timeout_s=args.ready_timeout,
        )
        _print_summary(console, summary.lines())
        console.line(f"\nnext: torchfleet status {args.stack} | torchfleet down {args.stack}")
        return stage.EXIT_OK
    if args.command == "down":
        pipeline.down(args.stack, console, yes=args.yes)
        console.line(f"\nstack {args.stack} destroyed")
        return stage.EXIT_OK
    if args.command == "status":
        summary = pipeline.status(args.stack, console, ssh_key=args.ssh_key)
        _print_summary(console, summary.lines())
        down = [n.host for n in summary.nodes if not n.ready] + summary.unready
        return stage.STAGES["readiness"] if down else stage.EXIT_OK
    if args.command == "rotate-token":
        from infra.deploy import preflight, rotation

        _, cfg = preflight.check_config(args.stack)

        def up() -> None:
            _print_summary(console, pipeline.up(args.stack, console, ssh_key=args.ssh_key).lines())

        def probe() -> AbstractContextManager[rotation.Probe]:
            group = cfg is not None and cfg.mode == "group"
            # instances mode reaches a node-owned endpoint through that node's SSH tunnel
            key = None if group else preflight.run(args.stack, args.ssh_key, need=("ssh",)).ssh_key
            return pipeline.endpoint_probe(args.stack, cfg, key)

        rotation.rotate(args.stack, console, cfg, up, finish=args.finish, probe=probe)
        return stage.EXIT_OK
    if args.command == "rollout":
        from infra.rollout import command as rollout

        def up_of(stack: str) -> Callable[[], None]:
            return lambda: _print_summary(console, pipeline.up(stack, console).lines())

        return rollout.run(args, console.line, up_of)
    if args.command == "cost":
        from infra import spend

        with pipeline.spend_errors():
            days = spend.parse_since(args.since)
        _print_summary(console, pipeline.cost(args.stack, console, days))
        return stage.EXIT_OK
    if args.command == "demo":
        from infra.deploy import containers, demo

        prefix = containers.default_prefix()
        if args.clean:
            return demo.clean(console, prefix)
        result = demo.run(
            console, prefix, args.nodes, bench=not args.no_bench, plan=not args.no_plan
        )
        _print_summary(console, result.summary.lines())
        console.line("")
        for line in demo.not_done().splitlines():
            console.line(line)
        console.line(
            f"\nmake demo-clean removes the {len(result.nodes)} container(s) and "
            "everything else the demo made; a second `make demo` reuses them"
        )
        return stage.EXIT_OK
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(verbose=args.verbose)
    try:
        return _dispatch(args, console)
    except StageError as err:
        console.line("")
        for line in err.render():
            console.line(line)
        return err.exit_code
    except KeyboardInterrupt:
        console.line("\ninterrupted: every stage is idempotent, run the same command again")
        return stage.EXIT_INTERRUPTED
    except Exception:  # a bug: the traceback goes to the run log and stderr
        console.to_log(traceback.format_exc())
        traceback.print_exc()
        return stage.EXIT_BUG
    finally:
        console.close()


if __name__ == "__main__":
    sys.exit(main())
