"""`torchfleet-runtime serve | check | diagnose | demo-model`.

`check` is torchfleet-compat's (torchfleet_compat.check, on that package's one probe and one
judge) and `diagnose` asks a running runtime what on-call needs (diagnose.py); each is imported
only when chosen so `serve` starts without it, and exposes configure_parser(parser) and
run(args) -> int. The load generator is not part of the node package: it runs on the
controller (`torchfleet-bench load URL`, benchmarks/).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from typing import Sequence

from torchfleet_compat.problems import sentence

from . import __version__
from .config import FIELDS, ConfigError, load_config

PLUGINS = {
    "check": (
        "torchfleet_compat.check",
        "check this node: torch, CUDA, driver, GPU, disk, memory",
    ),
    "diagnose": (
        "torchfleet_runtime.diagnose",
        "what on-call needs from this node: state, stage timings, replicas, batches, memory",
    ),
}


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over HTTP",
        description="Serve a model over HTTP. Precedence: flags > env TORCHFLEET_<KEY> > YAML config "
        "(--config, else /etc/torchfleet/runtime.yml if present) > defaults.",
    )
    p.add_argument(
        "--config", metavar="FILE", help="YAML file whose keys are these flags in snake_case"
    )
    for key, field in FIELDS.items():
        # default None: "not given", so lower-precedence sources show through
        p.add_argument(
            "--" + key.replace("_", "-"),
            dest=key,
            default=None,
            metavar=key.upper(),
            help=field.help or field.allowed,
        )
    p.set_defaults(func=_serve)


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo-model", help="write a small ResNet-style TorchScript model and its metadata"
    )
    p.add_argument("output_dir", metavar="OUTPUT_DIR")
    p.set_defaults(func=_demo_model)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchfleet-runtime", description="Warmed-up, batching PyTorch inference service."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _serve_parser(sub)
    for name, (_, help_text) in PLUGINS.items():
        sub.add_parser(name, help=help_text, add_help=False)  # parsed by the plugin (see main)
    _demo_parser(sub)
    return parser


# Read once, when torch loads (so set before the first torch import); a value already in the
# environment wins.
# - OpenMP threads that spin at every barrier take the cores from the HTTP thread and, on a busy
#   node, from each other (benchmarks/README.md: the demo model served an order of magnitude
#   less under load with libgomp's default, active, policy).
# - CUDA numbers GPUs fastest first by default; in PCI bus order cuda:N is nvidia-smi's (and
#   NVML's) GPU N, so a replica's `device` label and its GPU's NVML metrics name the same GPU.
ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _serve(args: argparse.Namespace) -> int:
    # A reload asked for while torch still imports must not kill the process (SIGHUP's default
    # action, which systemd's Restart=on-failure counts as a clean exit): ignore it until the
    # real handler is in place.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from . import logs
    from .app import Service  # torch import: only for commands that need it

    flags = {k: getattr(args, k) for k in FIELDS}
    try:
        config, _ = load_config(flags, config_file=args.config)
    except ConfigError as exc:
        print(f"torchfleet-runtime serve: {exc}", file=sys.stderr)
        return 2
    if not config.model and not config.factory:
        missing = sentence("model", None, FIELDS["model"].allowed + " (--model PATH)")
        print(f"torchfleet-runtime serve: {missing}", file=sys.stderr)
        return 2
    logs.setup(config.log_level, config.log_format)
    try:
        service = Service(config)  # reads the token file and the TLS certificate
    except ConfigError as exc:
        print(f"torchfleet-runtime serve: {exc}", file=sys.stderr)
        return 2
    code = service.serve_until_stopped()
    busy = service.unfinished_threads()
    if busy:
        _exit_now(code, busy)
    return code


def _exit_now(code: int, busy: list[str]) -> None:
    """End the process without interpreter shutdown. A thread still inside torch (a batch that
    outlived drain_timeout_s, a warm-up a SIGTERM cut short) would meet finalisation half-way:
    when it returns to Python it is stopped with pthread_exit, whose unwinding through torch's
    C++ frames ends in std::terminate ("terminate called without an active exception", exit 134;
    SIGSEGV, 139, in containers). Nothing is left to clean up (every answer is written, the
    sockets are closed): flush the logs and leave with the exit code drained work earned."""
    import logging

    logging.getLogger(__name__).info("exiting now: %s still running model code", ", ".join(busy))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _demo_model(args: argparse.Namespace) -> int:
    from .demo import write_demo_model

    model, meta = write_demo_model(args.output_dir)
    print(f"wrote {model} and {meta}")
    return 0


def _run_plugin(name: str, argv: Sequence[str]) -> int:
    module_name, help_text = PLUGINS[name]
    module = importlib.import_module(module_name)  # a dependency of this package: always there
    parser = argparse.ArgumentParser(prog=f"torchfleet-runtime {name}", description=help_text)
    module.configure_parser(parser)
    return int(module.run(parser.parse_args(list(argv))))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PLUGINS:
        return _run_plugin(argv[0], argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
