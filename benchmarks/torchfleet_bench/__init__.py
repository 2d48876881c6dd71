"""torchfleet-bench: the benchmarks of torchfleet as one command-line tool, run on the controller
or a workstation, never shipped to a node (`python -m torchfleet_bench COMMAND` or
`torchfleet-bench COMMAND`; `torchfleet-bench --help` lists the commands).

Contract: the client side of every benchmark is shared: the connections, request bodies and
model card come from infra.client (the controller's one client of a runtime), the closed loop
from `levels`, the offline ceiling from `offline` (with `pipeline`, which times the runtime's own
batch pipeline, the only imports of the runtime's internals in the tool, and so on the
controller side), the host facts and plots from `report`. Each command
is a module with `main(argv) -> exit status`, listed in `cli.COMMANDS`.
"""


class BenchError(Exception):
    """A problem the user can fix (bad flag, unreachable server): one line, exit status 2."""
