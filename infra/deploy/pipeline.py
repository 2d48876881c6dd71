"""The jobs: `up`, `down`, `status`, and the node stages `up` and the demo share.

    up STACK   preflight -> provision (pulumi up, Automation API) -> inventory -> converge
               (site.yml, verify.yml through ansible-runner) -> readiness -> smoke -> summary;
               mode: kubernetes: kubeconfig (no inventory, no converge) -> the Deployment's
               replicas and the Service's load balancer -> smoke (infra/deploy/kubernetes.py)
    down STACK preflight -> destroy (pulumi destroy; a prod stack only with --yes)
    status     outputs -> per-node readiness and batch cap (or the group's healthy count, or
               the Deployments' replicas and the Service) -> cost per hour now, TTL left

`node_stages` is everything after the outputs exist: the demo calls it with the mock-engine
outputs of aws-dev whose addresses point at container nodes, `up` with the real ones, so the
demo exercises the same code as a deploy. Each run keeps its log, its (masked) outputs and
ansible-runner's artifacts under `.cache/runs/<stack>/<timestamp>/`."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from infra import client, spend
from infra.config import StackConfig
from infra.constants import CA_OUTPUT, SERVICE_PORT
from infra.deploy import (
    automation,
    capacity,
    converge,
    inventory,
    kubernetes,
    preflight,
    readiness,
    smoke,
)
from infra.deploy.access import SshTarget, tunnel
from infra.deploy.progress import Console, shown
from infra.deploy.stage import StageError
from infra.deploy.summary import Summary
from infra.matrix import REPO_ROOT

RUNS = REPO_ROOT / ".cache" / "runs"
INVENTORIES = REPO_ROOT / "inventories"
READY_TIMEOUT_S = 900.0  # a cold GPU node's warm-up; the role itself already waited for /readyz
GROUP_READY_TIMEOUT_S = 1800.0  # the group's nodes boot, converge and warm up by themselves


def run_dir(stack: str, root: Path | None = None) -> Path:
    path = (root or RUNS) / stack / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path.mkdir(parents=True, exist_ok=True)
    return path


class Steps:
    """Numbered stage headers across a job: [n/total] name: title."""

    def __init__(self, console: Console, total: int) -> None:
        self.console, self.total, self.n = console, total, 0

    @contextlib.contextmanager
    def __call__(self, name: str, title: str) -> Iterator[None]:
        self.n += 1
        with self.console.stage(self.n, self.total, name, title):
            yield


@dataclass
class NodeOptions:
    inventory_root: Path = INVENTORIES
    private_key: str | None = None
    ready_timeout_s: float = READY_TIMEOUT_S
    writer: str = "torchfleet up"
    # the CA an https endpoint is checked against (None: the system's, as for an ACM
    # certificate); the demo's load balancer has one made for the run
    cafile: str | None = None
    # the smoke prediction goes to the endpoint itself even when its address is a node's (the
    # demo's load balancer listens on the loopback address its nodes' SSH ports are on)
    smoke_direct: bool = False
    # mode: kubernetes: the readiness wait's bounds (infra/deploy/kubernetes.py)
    kubernetes: kubernetes.Options | None = None


def is_kubernetes(outputs: dict[str, Any], cfg: StackConfig | None) -> bool:
    """A mode: kubernetes stack (by its config, or by the kubeconfig output without one)."""
    return cfg.mode == "kubernetes" if cfg else "kubeconfig" in outputs


def auth_of(outputs: dict[str, Any], cafile: str | None = None) -> client.Auth:
    """What the stack's clients send and check: its API token output (a Pulumi secret), and the
    CA of a certificate the stack generated (its output CA_OUTPUT: that CA alone is then
    trusted, not the system's) unless a `cafile` is given."""
    token = outputs.get("api_token")
    ca = None if cafile else outputs.get(CA_OUTPUT)
    return client.Auth(
        token=str(token) if token else None, cafile=cafile, cadata=str(ca) if ca else None
    )


def _service_port(outputs: dict[str, Any], cfg: StackConfig | None) -> int:
    if cfg:
        return cfg.service_port
    return urlsplit(str(outputs.get("endpoint") or "")).port or SERVICE_PORT


def targets(hosts: dict[str, dict[str, Any]], private_key: str | None) -> list[SshTarget]:
    return [SshTarget.from_hostvars(name, hv, private_key) for name, hv in hosts.items()]


def endpoint_target(
    endpoint: str, hosts: dict[str, dict[str, Any]], ts: list[SshTarget]
) -> SshTarget | None:
    """The node that owns the endpoint's address (instances mode: a node's private IP)."""
    host = urlsplit(endpoint).hostname
    for t in ts:
        hv = hosts.get(t.host, {})
        if host in (hv.get("private_ip"), hv.get("public_ip"), hv.get("ansible_host")):
            return t
    return None


@contextlib.contextmanager
def endpoint_probe(
    stack: str, cfg: StackConfig | None, private_key: str | None
) -> Iterator[Callable[[str], int | None]]:
    """A probe of the stack's endpoint as its clients use it: one GET /v1/model (which needs the
    token) with a given token, its status (None: nothing answered). Reached as the smoke stage
    reaches it: straight, or through the SSH tunnel of the node that owns its address."""
    outputs = automation.outputs(stack).values
    endpoint = str(outputs.get("endpoint") or "")
    auth = auth_of(outputs)
    owner = None
    inv = inventory.inventory_of(outputs) if cfg is None or cfg.mode == "instances" else {}
    if inv and inventory.hosts_of(inv):
        inventory.write(stack, inv, INVENTORIES, writer="torchfleet rotate-token")
        hosts = converge.hostvars(INVENTORIES / stack)
        owner = endpoint_target(endpoint, hosts, targets(hosts, private_key))
    with (
        contextlib.nullcontext(endpoint)
        if owner is None
        else tunnel(owner, _service_port(outputs, cfg), "rotate-token")
    ) as base:

        def probe(token: str) -> int | None:
            code, _, _ = client.request(
                "GET", base.rstrip("/") + "/v1/model", timeout=30, auth=replace(auth, token=token)
            )
            return code

        yield probe


def node_stages(
    stack: str,
    outputs: dict[str, Any],
    cfg: StackConfig | None,
    steps: Steps,
    console: Console,
    run: Path,
    opts: NodeOptions,
) -> Summary:
    summary = Summary(stack, outputs, cfg, artifacts=shown(run))
    if is_kubernetes(outputs, cfg):
        return kubernetes.stages(
            outputs, cfg, steps, console, summary, auth_of(outputs, opts.cafile), opts.kubernetes
        )
    with steps("inventory", f"stack outputs -> {shown(opts.inventory_root / stack / 'stack.yml')}"):
        try:
            inv = inventory.inventory_of(outputs)
        except inventory.InventoryError as err:
            raise StageError(
                "inventory",
                str(err),
                fix="check the stack's `inventory` output "
                "(`pulumi stack output inventory`); a re-run of `up` rewrites it",
            ) from err
        path = inventory.write(stack, inv, opts.inventory_root, writer=opts.writer)
        listed = inventory.hosts_of(inv)
        console.line(
            f"  wrote {shown(path)}: "
            + (
                ", ".join(f"{h} ({v['ansible_host']})" for h, v in listed.items())
                if listed
                else "no hosts (group mode: the nodes are found by tag)"
            )
        )
    port = _service_port(outputs, cfg)
    endpoint = str(outputs.get("endpoint") or "")
    auth = auth_of(outputs, opts.cafile)
    if not listed:
        return _group_stages(stack, outputs, cfg, steps, console, summary, auth)

    inventory_dir = opts.inventory_root / stack
    with steps("converge", f"site.yml and verify.yml on {len(listed)} host(s) (ansible-runner)"):
        hosts = converge.hostvars(inventory_dir)
        for playbook in ("site.yml", "verify.yml"):
            console.line(f"  {playbook}")
            result = converge.run_playbook(
                playbook, inventory_dir, run, console, list(hosts), private_key=opts.private_key
            )
            if playbook == "site.yml":
                changed = result.changed()
                console.line(
                    f"  site.yml: changed={changed}"
                    + (" (already converged: nothing to change)" if changed == 0 else "")
                )
    ts = targets(hosts, opts.private_key)
    with steps(
        "readiness", f"GET /readyz on every node until 200 (at most {opts.ready_timeout_s:.0f} s)"
    ):
        summary.nodes = readiness.wait_instances(ts, port, console, opts.ready_timeout_s, auth)
    with steps("smoke", f"one prediction through the endpoint {endpoint}"):
        owner = None if opts.smoke_direct else endpoint_target(endpoint, hosts, ts)
        if owner is None:
            summary.prediction = smoke.predict(endpoint, endpoint, "direct", auth)
        else:
            with tunnel(owner, port, "smoke") as base:
                summary.prediction = smoke.predict(
                    base, endpoint, f"ssh tunnel through {owner.host}", auth
                )
        console.line(f"  {summary.prediction.describe()}")
    return summary


def _group_stages(
    stack: str,
    outputs: dict[str, Any],
    cfg: StackConfig | None,
    steps: Steps,
    console: Console,
    summary: Summary,
    auth: client.Auth,
) -> Summary:
    with steps("converge", "group mode: each node converges itself"):
        console.line(
            "  skipped here: the scaling group's nodes run the same site.yml from the "
            "stack's bundle at boot (cloud-init) and turn healthy only when /readyz is 200"
        )
    cloud = cfg.cloud if cfg else str((outputs.get("discovery") or {}).get("cloud"))
    with steps("readiness", "the group's healthy count reaches desired"):
        health = readiness.wait_group(stack, cloud, outputs, console, GROUP_READY_TIMEOUT_S)
        if health:
            summary.group = f"{health.healthy}/{health.desired} healthy targets"
    with steps("smoke", f"one prediction through the endpoint {outputs.get('endpoint')}"):
        summary.prediction = smoke.predict(
            str(outputs["endpoint"]), str(outputs["endpoint"]), "direct", auth
        )
        console.line(f"  {summary.prediction.describe()}")
    return summary


def _preflight(
    steps: Steps,
    console: Console,
    stack: str,
    title: str,
    need: tuple[str, ...],
    ssh_key: str | None = None,
) -> preflight.Preflight:
    with steps("preflight", title):
        pf = preflight.run(stack, ssh_key=ssh_key, need=need)
        for line in pf.lines():
            console.line(line)
        if pf.problems:
            raise StageError(
                "preflight",
                f"{len(pf.problems)} thing(s) missing (above); nothing was created",
                fix="fix each MISSING line, then re-run the same command",
            )
    return pf


def up(
    stack: str,
    console: Console,
    ssh_key: str | None = None,
    skip_provision: bool = False,
    ready_timeout_s: float | None = None,
) -> Summary:
    """`ready_timeout_s` None: the mode's own bound (READY_TIMEOUT_S, or kubernetes')."""
    run = run_dir(stack)
    console.open_log(run / "up.log")
    steps = Steps(console, 6)
    pf = _preflight(
        steps,
        console,
        stack,
        "what `up` needs, checked before anything is created",
        ("config", "credentials", "prices", "pulumi", "ssh"),
        ssh_key,
    )
    with steps(
        "provision",
        f"pulumi up of stack {stack} (Automation API)"
        + (": skipped, reading the current outputs" if skip_provision else ""),
    ):
        result = (
            automation.outputs(stack)
            if skip_provision
            else capacity.provision(
                pf.cfg, lambda env: automation.up(stack, console, env=env), console.line
            )
        )
        (run / "outputs.json").write_text(json.dumps(result.masked(), indent=2, default=str))
        console.line(
            f"  outputs: {', '.join(sorted(result.values))} (saved, secrets masked, in "
            f"{shown(run / 'outputs.json')})"
        )
        if pf.cfg is not None and pf.cfg.cloud == "aws" and not skip_provision:
            console.line(f"  {spend.activate_stack_tag()}")
    return node_stages(
        stack,
        result.values,
        pf.cfg,
        steps,
        console,
        run,
        NodeOptions(
            inventory_root=INVENTORIES,
            private_key=pf.ssh_key,
            ready_timeout_s=READY_TIMEOUT_S if ready_timeout_s is None else ready_timeout_s,
            kubernetes=kubernetes.Options(
                timeout_s=kubernetes.READY_TIMEOUT_S if ready_timeout_s is None else ready_timeout_s
            ),
        ),
    )


def is_prod(stack: str, cfg: StackConfig | None) -> bool:
    return (cfg.env if cfg else stack.rpartition("-")[2]) == "prod"


def what_down_destroys(cfg: StackConfig | None) -> str:
    """What `pulumi destroy` of the stack removes, in words (the refusal and the stage say it)."""
    if cfg is not None and cfg.mode == "kubernetes":
        return (
            "the cluster (control plane, system and GPU node pools, add-ons), the runtime's "
            "Deployments and its Service's load balancer, the network, schedules, TTL and budget"
        )
    if cfg is not None and cfg.mode == "group":
        return "its load balancer, group and every node, the network, schedules, TTL and budget"
    return "every node, the network, schedules, TTL and budget"


def down(stack: str, console: Console, yes: bool = False) -> None:
    run = run_dir(stack)
    console.open_log(run / "down.log")
    steps = Steps(console, 2)
    pf = _preflight(steps, console, stack, "what `down` needs", ("config", "credentials", "pulumi"))
    destroys = what_down_destroys(pf.cfg)
    if is_prod(stack, pf.cfg) and not yes:
        raise StageError(
            "refused",
            f"{stack} is a prod stack: `down` destroys {destroys}",
            fix=f"torchfleet down {stack} --yes",
        )
    with steps("destroy", f"pulumi destroy of stack {stack}: {destroys}"):
        automation.destroy(stack, console)
        stale = INVENTORIES / stack / "stack.yml"
        if stale.exists():
            stale.unlink()
            console.line(f"  removed {stale} (its hosts are gone)")


def status(stack: str, console: Console, ssh_key: str | None = None) -> Summary:
    steps = Steps(console, 3)
    cfg = preflight.check_config(stack)[1]
    # the cloud's credentials only for a group (its healthy count comes from the cloud's API)
    # or a cluster (EKS's kubeconfig gets its token with them)
    cloudy = cfg is not None and cfg.mode in ("group", "kubernetes")
    need = ("config", "pulumi", "ssh") + (("credentials",) if cloudy else ())
    pf = _preflight(steps, console, stack, "what `status` needs", need, ssh_key)
    cfg = pf.cfg
    with steps("outputs", f"the current outputs of stack {stack}"):
        result = automation.outputs(stack)
        console.line(f"  outputs: {', '.join(sorted(result.values))}")
    with steps(
        "status",
        "the Deployments' replicas and the load balancer"
        if is_kubernetes(result.values, cfg)
        else "per-node readiness and batch cap, or the group's healthy count",
    ):
        return status_of(stack, result.values, cfg, INVENTORIES, pf.ssh_key)


@contextlib.contextmanager
def spend_errors() -> Iterator[None]:
    """infra.spend's refusals (a bad `--since`, no credentials for the bill) as the preflight
    stage's error: the operator's to fix before any call."""
    try:
        yield
    except spend.SpendError as err:
        raise StageError("preflight", str(err)) from err


def cost(stack: str, console: Console, since_days: int, today: date | None = None) -> list[str]:
    """`torchfleet cost`: the stack's measured spend over the last `since_days` whole days next
    to the estimate for the same hours (infra.spend)."""
    from infra.cost import estimate
    from infra.program import with_region_prices

    steps = Steps(console, 2)
    pf = _preflight(steps, console, stack, "what `cost` needs", ("config", "credentials"))
    assert pf.cfg is not None
    cfg = with_region_prices(pf.cfg)
    start, end = spend.window(since_days, today or datetime.now(UTC).date())
    cmp = spend.estimate_for(estimate(cfg), start, end)
    with steps("cost", f"the bill of stack {stack}, {start} to {end} (UTC)"):
        if cfg.cloud == "aws":
            console.line(f"  {spend.activate_stack_tag()}")
            api, grant = "Cost Explorer GetCostAndUsage", "ce:GetCostAndUsage"
        else:
            api, grant = "BSS DescribeInstanceBill", "read access to BSS (AliyunBSSReadOnlyAccess)"
        try:
            with spend_errors():
                measured = (
                    spend.aws_spend(stack, start, end)
                    if cfg.cloud == "aws"
                    else spend.alicloud_spend(stack, cfg.region, start, end)
                )
        except StageError:
            raise
        except Exception as err:  # the SDKs' errors: access denied, no data, the network
            raise StageError(
                "status",
                f"{api} for tag stack={stack} failed: {err}",
                fix=f"the credentials need {grant}; then re-run",
            ) from err
        return spend.lines(cfg, measured, cmp)


def status_of(
    stack: str,
    outputs: dict[str, Any],
    cfg: StackConfig | None,
    inventory_root: Path,
    private_key: str | None,
) -> Summary:
    """What the stack's nodes say now: one look at each (no waiting), or the group's count, or
    the cluster's Deployments and Service."""
    summary = Summary(stack, outputs, cfg)
    if is_kubernetes(outputs, cfg):
        return kubernetes.status_of(outputs, cfg, summary)
    inv = inventory.inventory_of(outputs)
    if inventory.hosts_of(inv):
        inventory.write(stack, inv, inventory_root, writer="torchfleet status")
        hosts = converge.hostvars(inventory_root / stack)
        port = _service_port(outputs, cfg)
        auth = auth_of(outputs)
        summary.nodes = [readiness.probe(t, port, auth) for t in targets(hosts, private_key)]
    elif (cfg.cloud if cfg else None) == "aws":
        health = readiness.aws_group_health(stack, outputs)
        summary.group = (
            f"{health.healthy}/{health.desired} healthy targets ("
            + ", ".join(f"{k} {v}" for k, v in sorted(health.states.items()))
            + ")"
        )
    else:
        summary.group = "not read on alicloud by this version (`aliyun slb DescribeHealthStatus`)"
    return summary
