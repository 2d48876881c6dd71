"""Stages, their exit codes and the one error type every stage raises.

A stage that fails raises `StageError(stage, message, host=..., task=..., fix=...)`; the CLI
prints it (which stage, which host, which task, what to do) and exits with the stage's code.
Every stage is idempotent, so the fix for any failure ends with "re-run the same command".

Exit codes (the CLI's contract, also in `torchfleet --help` and docs/deploy/exit-codes.md):

    0   success
    1   an unexpected error (a bug: the traceback is in the run log)
    2   usage: unknown command, stack or option
    3   preflight: something is missing; nothing was created
    4   provision: `pulumi up` / `pulumi destroy` failed
    5   inventory: the stack outputs are not a torchfleet inventory (kubernetes: no kubeconfig
            or workload output)
    6   converge: site.yml or verify.yml failed on a host
    7   readiness: a node never answered /readyz 200, the group never reached desired, the
            cluster's Deployment or its Service's load balancer never did, or the endpoint never
            accepted a rotation's next token
    8   smoke: the prediction through the stack's endpoint failed
    9   refused: a prod stack without --yes, a demo prefix that is not the demo's, or a
            rotation that cannot start or finish
    130 interrupted (Ctrl-C)
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXIT_OK = 0
EXIT_BUG = 1
EXIT_USAGE = 2
EXIT_REFUSED = 9
EXIT_ROLLED_BACK = 10  # `torchfleet rollout`: a guard (or abort) rolled the candidate back
EXIT_INTERRUPTED = 130

# stage -> exit code; the order is the order `up` runs them in.
STAGES: dict[str, int] = {
    "preflight": 3,
    "provision": 4,
    "inventory": 5,
    "converge": 6,
    "readiness": 7,
    "smoke": 8,
}
# Stages outside `up` report under the code closest in meaning.
OTHER_STAGES: dict[str, int] = {
    "nodes": 6,  # the demo's container nodes: they stand in for provisioned machines
    "destroy": 4,
    "outputs": 5,
    "status": 7,
    "refused": EXIT_REFUSED,
}


@dataclass
class StageError(Exception):
    stage: str
    message: str
    host: str | None = None
    task: str | None = None
    fix: str | None = None
    details: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def exit_code(self) -> int:
        return STAGES.get(self.stage) or OTHER_STAGES.get(self.stage) or EXIT_BUG

    def render(self) -> list[str]:
        where = [f"host {self.host}"] if self.host else []
        if self.task:
            where.append(f"task '{self.task}'")
        head = f"FAILED at stage {self.stage}" + (f" ({', '.join(where)})" if where else "")
        lines = [head, f"  {self.message}"]
        lines += [f"    {d}" for d in self.details]
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return lines
