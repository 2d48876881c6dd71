"""`torchfleet-bench COMMAND [ARGS...]`: one command line over every benchmark of the project.

Each command is a module of this package with `main(argv) -> exit status`, imported only when it
runs (so `load` needs neither torch nor wrk, and `codec` alone imports the runtime's codec).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from torchfleet_compat.problems import sentence

PROG = "torchfleet-bench"
# command -> (module, what it measures)
COMMANDS = {
    "load": (
        "load",
        "closed-loop load on a running runtime; --offline MODEL: its in-process ceiling",
    ),
    "runtime": (
        "runtime",
        "`make bench`: the runtime on the demo model, served / offline and more",
    ),
    "peers": ("peers.bench", "`make bench-peers`: side by side with Mosec, LitServe, TorchServe"),
    "http-stack": ("http_stack", "HTTP stack candidates for the runtime's edge under wrk"),
    "codec": ("codec", "per-request CPU of the request codec and instrumentation, in-process"),
    "ab": ("ab", "runtime variants (source, flags, environment) under wrk, alternated"),
    "tls": ("tls", "what HTTPS on the node (tls_cert_file) costs per request against plain HTTP"),
    "replicas": (
        "replicas",
        "model replicas on two CPUs: 2 x 1 thread vs 1 x 2, and two SO_REUSEPORT processes",
    ),
    "edges": (
        "edges",
        "the CPU proxy of the edge processes: a near-zero-cost model, edge_workers 1 vs 2",
    ),
    "gpu": (
        "gpu",
        "the GPU check's table: replicas vs one device, fp16 vs fp32, batching, memory sizing",
    ),
    "py39": ("py39", "the runtime on the legacy stack (Python 3.9, torch 1.12.1) in a container"),
    "pipeline": (
        "pipeline",
        "the batch pipeline offline per bucket: eager vs staged vs CUDA graphs, worker work-ahead",
    ),
    "gpu-peers": (
        "gpu_peers",
        "the GPU side by side: torchfleet (edges 1 / auto) vs Mosec (1 / N decoders), wrk",
    ),
    "gpu-pack": (
        "gpu_pack",
        "wheels, wrk and an entry script for a GPU machine with no package index (.cache/)",
    ),
    "rollout-step": (
        "rollout_step",
        "one group-mode rollout weight step under the mock engine: whole `up` vs targeted",
    ),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items())
    return (
        f"usage: {PROG} COMMAND [ARGS...]\n\ncommands:\n{rows}\n\n"
        f"`{PROG} COMMAND --help` lists a command's options."
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"{PROG}: {sentence('command', name, ', '.join(COMMANDS))}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"torchfleet_bench.{COMMANDS[name][0]}")
    return int(module.main(rest) or 0)
