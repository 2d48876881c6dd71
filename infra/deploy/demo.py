"""`make demo` (`torchfleet demo`): the main job, `up`, on this machine with containers as nodes.

No cloud account, no GPU. It starts NODES systemd container nodes (infra.deploy.containers),
takes the outputs of the aws-dev program under Pulumi's mock engine (with nodes.count = NODES)
and points their addresses at the containers, puts HAProxy in front of them as the stand-in for
the ALB/CLB (infra.deploy.balancer: HTTPS with a CA made for the demo, health checks on /readyz;
the stack's endpoint is that load balancer), then runs the same node stages as `torchfleet up`
(pipeline.node_stages: inventory -> site.yml + verify.yml through ansible-runner -> readiness
-> smoke prediction through the load balancer, certificate verified, with the API token), shows
what the load balancer answers and sees (no token: 401; its backends), sends predictions and a
short bounded benchmark to each node's runtime port published on loopback, prints the offline
plan and cost of aws-dev and alicloud-dev, and says what it did not do. Auth is on as in a
stack: the demo makes its API token once (state folder, 0600) and the nodes require it. A
second run reuses the converged nodes (the converge reports changed=0); `torchfleet demo --clean`
(`make demo-clean`) removes what it made, the load balancer too.

The demo's fleet is a local fleet `torchfleet rollout` moves (infra/rollout/local.py): each
node's model directory is a folder of this machine mounted into its container (containers.py),
the runtime's admin API is on with an admin token the demo makes like the API token (state
folder, 0600; the role writes it into the node's runtime.yml, no_log), each runtime has a
shadow_model path beside its model, and the demo writes the fleet's description (fleet.json:
node URLs on the published ports, model and shadow paths here, the load balancer, the tokens'
files) where `torchfleet rollout aws-dev` looks for it, .cache/fleet/aws-dev/ (a demo with
another container prefix: its state folder, given with --fleet).

What the demo changes in the stack's host entries, because a container is not a g6.xlarge:
the addresses (ansible_host/ansible_port/public_ip on loopback, private_ip = the container's
address), the endpoint (the local load balancer) and the GPU facts (no GPU: profile cpu, no GPU
model, not spot); and the nodes get the demo's token from their group vars, not from a cloud
secret store. Everything else is the stack's output as `pulumi up` would write it."""

from __future__ import annotations

import copy
import fcntl
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from torchfleet_compat.hostvars import node_hostvars

from infra import client
from infra import config as stack_config
from infra.constants import SERVICE_PORT
from infra.deploy import automation, balancer, containers
from infra.deploy.pipeline import NodeOptions, Steps, node_stages, run_dir
from infra.deploy.progress import Console, shown
from infra.deploy.stage import StageError
from infra.deploy.summary import Summary
from infra.inventory import GROUP
from infra.matrix import REPO_ROOT
from infra.offline import run_offline
from infra.plan import cost_rows
from infra.rollout.command import FLEETS
from infra.rollout.local import FLEET_FILE, LocalFleet, LocalNode
from infra.stacks import load_stack_config

SHAPE_STACK = "aws-dev"  # the stack whose outputs the demo's inventory copies
PLAN_STACKS = ("aws-dev", "alicloud-dev")
DEMO_ROOT = REPO_ROOT / ".cache" / "demo"
BENCH_LEVELS = (1, 8)
BENCH_SECONDS = 3.0
# Where the role puts the demo model under its models directory (containers.MODELS_DIR, mounted
# from this machine): inference_runtime_model_name `demo`, file model.pt (tasks/model.yml); the
# demo gives the runtime a shadow_model path beside it, which exists only while a shadow runs.
MODEL_FILE = "demo/model.pt"
SHADOW_FILE = "demo/shadow.pt"
SHADOW_SAMPLE = 0.5  # the share of live requests a shadow candidate sees on the demo's nodes
# The stack's facts a container node does not share (NOT_DONE names them).
REPLACED = (
    "torchfleet_gpu_model",
    "torchfleet_compute_capability",
    "torchfleet_cuda_profile",
    "torchfleet_spot",
)


def state_dir(prefix: str) -> Path:
    return DEMO_ROOT / prefix.rstrip("-")


def _private(path: Path, text: str) -> None:
    """Write `text` readable by the owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _token(path: Path) -> str:
    """The token in `path`, made once (0600) as a stack's secret is once per stack."""
    if not path.exists():
        _private(path, secrets.token_urlsafe(36) + "\n")  # 48 characters the runtime accepts
    return path.read_text().strip()


def api_token(state: Path) -> str:
    """The demo's API token (/v1/* on the nodes and through the load balancer)."""
    return _token(state / "api-token")


def admin_token_file(state: Path) -> Path:
    """The file of the demo's admin token (the runtimes' POST /admin/reload, which a rollout
    calls): made once, read by whoever reloads, never passed on a command line."""
    path = state / "admin-token"
    _token(path)
    return path


def fleet_dir(prefix: str) -> Path:
    """Where the demo describes its fleet for `torchfleet rollout` (fleet.json): the default
    prefix's where the command looks for aws-dev, another prefix's (a test's) in its own state
    folder (`--fleet DIR`), so it never replaces a developer's demo fleet."""
    if prefix == containers.PREFIX:
        return FLEETS / SHAPE_STACK
    return state_dir(prefix) / "fleet"


def describe_fleet(
    prefix: str, lb: balancer.Balancer, nodes: list[containers.ContainerNode], auth: client.Auth
) -> LocalFleet:
    """Write the fleet.json of the demo's nodes: each node's served model and shadow path as
    files of this machine (its mounted model directory), its runtime's published port, the load
    balancer, the admin token's file and the API token."""
    state = state_dir(prefix)
    local = []
    for n in nodes:
        models = state / "models" / n.name
        if not (models / MODEL_FILE).is_file():
            raise StageError(
                "edge",
                f"{n.name} serves no {MODEL_FILE} in its mounted model directory {shown(models)}",
                host=n.name,
                fix="the inference_runtime role's model path changed: update demo.MODEL_FILE",
            )
        local.append(LocalNode(n.name, n.url, str(models / MODEL_FILE), str(models / SHADOW_FILE)))
    fleet = LocalFleet(fleet_dir(prefix), lb, local, admin_token_file(state), auth)
    fleet.describe()
    return fleet


def forget_fleet(prefix: str) -> Path | None:
    """Remove the demo's fleet description and its rollout's record and model store (only when
    fleet.json names this demo's load balancer); the folder, or None when there was none."""
    folder = fleet_dir(prefix)
    try:
        doc = json.loads((folder / FLEET_FILE).read_text())
        ours = Path(doc["balancer"]["folder"]) == state_dir(prefix) / "balancer"
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not ours:
        return None
    (folder / FLEET_FILE).unlink()
    (folder / "rollout.json").unlink(missing_ok=True)
    shutil.rmtree(folder / "models", ignore_errors=True)
    return folder


def start_balancer(state: Path, nodes: list[containers.ContainerNode]) -> balancer.Balancer:
    """HAProxy in front of the nodes' published runtime ports, HTTPS on a port kept per demo
    state (a second run keeps the endpoint), HTTP beside it only redirecting."""
    folder = state / "balancer"
    folder.mkdir(parents=True, exist_ok=True)
    ports_file = folder / "ports"
    try:
        https_port, http_port = map(int, ports_file.read_text().split())
    except (OSError, ValueError):
        https_port, http_port = balancer.free_port(), balancer.free_port()
        ports_file.write_text(f"{https_port} {http_port}\n")
    lb = balancer.Balancer(
        folder,
        [balancer.Backend(n.name, "127.0.0.1", n.service_port) for n in nodes],
        balancer.issue_certificates(folder / "tls"),
        https_port,
        http_port,
    )
    lb.start()
    return lb


def stack_values(stack: str, nodes: int | None = None) -> dict[str, Any]:
    values = copy.deepcopy(load_stack_config(stack))
    if nodes is not None:
        values["torchfleet:nodes"] = {"count": nodes}
    return values


def stack_outputs(count: int) -> dict[str, Any]:
    """The outputs of the aws-dev program with `count` nodes, under Pulumi's mock engine."""
    return run_offline(SHAPE_STACK, stack_values(SHAPE_STACK, count)).outputs


def container_host(host: dict[str, Any], ip: str, ssh_port: int) -> dict[str, Any]:
    """A host of the stack's outputs as a container node: its own host vars (an on-demand node
    whose GPU the preflight detects: no GPU table), reached over the SSH port the container
    publishes on loopback, with the CPU profile instead of the stack's CUDA one, and no cloud
    secret store to read the API token from (the demo's group vars give it)."""
    own = node_hostvars(
        host["torchfleet_instance_type"],
        False,
        {},
        private_ip=ip,
        public_ip="127.0.0.1",
        ssh_port=ssh_port,
    )
    return {
        **host,
        **own,
        "torchfleet_cuda_profile": "cpu",
        "inference_runtime_api_token_command": [],
    }


def login_user(outputs: dict[str, Any]) -> str:
    """The stack's login user (the image's: ubuntu on the Ubuntu AMIs)."""
    hosts = outputs["inventory"]["all"]["children"][GROUP]["hosts"]
    return str(next(iter(hosts.values()))["ansible_user"])


def node_outputs(
    template: dict[str, Any], nodes: list[containers.ContainerNode], key: Path
) -> dict[str, Any]:
    """`template` (the stack's outputs) with the addresses of the container nodes."""
    outputs = copy.deepcopy(template)
    hosts = outputs["inventory"]["all"]["children"][GROUP]["hosts"]
    if len(hosts) != len(nodes):
        raise RuntimeError(
            f"the {SHAPE_STACK} program made {len(hosts)} hosts for {len(nodes)} nodes"
        )
    for (name, host), node in zip(sorted(hosts.items()), nodes, strict=True):
        hosts[name] = container_host(host, node.ip, node.ssh_port)
    first, user = nodes[0], next(iter(hosts.values()))["ansible_user"]
    port = SERVICE_PORT
    outputs["endpoint"] = f"http://{first.ip}:{port}"
    outputs["ssh_tunnel"] = (
        f"ssh -N -L {port}:{first.ip}:{port} -p {first.ssh_port} -i {shown(key)} {user}@127.0.0.1"
    )
    return outputs


def write_group_vars(inventory_dir: Path, state: Path, key: Path, token: str) -> None:
    """The stack's own group_vars (inventories/aws-dev/group_vars/all.yml) plus the settings a
    container node needs, as a Molecule scenario sets them (gpu_nodes beats all). A container
    has no cloud secret store: the tokens come from here (a file only its owner reads). The
    model directory is the one containers.py mounts, with a shadow path for rollouts."""
    group_vars = inventory_dir / "group_vars"
    group_vars.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(
        REPO_ROOT / "inventories" / SHAPE_STACK / "group_vars" / "all.yml", group_vars / "all.yml"
    )
    demo = {
        "ansible_ssh_private_key_file": str(key),
        "ansible_ssh_common_args": (
            f"-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile="
            f"{state / 'known_hosts'} -o IdentitiesOnly=yes "
            "-o LogLevel=ERROR"
        ),
        "ansible_control_path_dir": str(state / "cp"),
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_pipelining": True,
        # torch 2.13.0 CPU from the wheelhouse mounted into the container (no index, no CUDA)
        "pytorch_wheelhouse": "/opt/wheelhouse",
        "pytorch_wheelhouse_on_node": True,
        "inference_runtime_model_source": "demo",
        # the timer runs for real; a container must not power itself off
        "autostop_enabled": True,
        "autostop_command": "logger -t torchfleet-autostop 'idle, would power off'",
        "inference_runtime_api_token": token,
        "inference_runtime_admin_token": admin_token_file(state).read_text().strip(),
        "inference_runtime_models_dir": containers.MODELS_DIR,
        "inference_runtime_shadow_model": f"{containers.MODELS_DIR}/{SHADOW_FILE}",
        "inference_runtime_shadow_sample": SHADOW_SAMPLE,
    }
    _private(
        group_vars / "gpu_nodes.yml",
        "# Written by torchfleet demo: what a container node needs beyond the stack's settings.\n"
        + yaml.safe_dump(demo, sort_keys=False),
    )


def predictions(
    node: containers.ContainerNode, console: Console, auth: client.Auth
) -> list[int | None]:
    """JSON, binary and a malformed request to the node's published runtime port."""
    base = node.url
    code, body, _ = client.request("GET", base + "/v1/model", auth=auth)
    card = json.loads(body)
    codes = []
    payload, headers = client.card_payload(card, batch=2, binary=False)
    code, body, took = client.request("POST", base + "/v1/predict", payload, headers, auth=auth)
    out = json.loads(body)["outputs"] if code == 200 else []
    console.line(
        f"  JSON    POST {base}/v1/predict (2 instances, {len(payload) // 1024} KiB) -> "
        f"{code} in {took * 1000:.0f} ms: argmax {[r.index(max(r)) for r in out]}"
    )
    codes.append(code)
    payload, headers = client.card_payload(card, batch=4, binary=True)
    code, body, took = client.request("POST", base + "/v1/predict", payload, headers, auth=auth)
    n = len(json.loads(body)["outputs"]) if code == 200 else 0
    console.line(
        f"  binary  POST {base}/v1/predict (4 instances, raw {headers['X-Dtype']}, X-Shape "
        f"{headers['X-Shape']}) -> {code} in {took * 1000:.0f} ms: {n} outputs"
    )
    codes.append(code)
    code, body, _ = client.request(
        "POST",
        base + "/v1/predict",
        b'{"inputs": [1, 2',
        {"Content-Type": "application/json"},
        auth=auth,
    )
    console.line(f"  malformed JSON -> {code} {body.decode(errors='replace')[:120]}")
    live, _, _ = client.request("GET", base + "/livez")
    console.line(f"  and the node keeps serving: /livez -> {live}")
    return codes


def tls_version(endpoint: str, cafile: str) -> str:
    """The TLS version a verified handshake with the endpoint agrees on."""
    target = client.Target.parse(endpoint)
    ctx = client.Auth(cafile=cafile).ssl_context()
    with (
        socket.create_connection((target.host, target.port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=target.host) as tls,
    ):
        return str(tls.version())


def through_the_balancer(
    lb: balancer.Balancer, auth: client.Auth, console: Console
) -> dict[str, int | None]:
    """What a client of the stack's endpoint sees, and what the load balancer sees."""
    assert auth.cafile is not None and auth.token
    url = lb.endpoint + "/v1/model"
    console.line(
        f"  endpoint {lb.endpoint} ({tls_version(lb.endpoint, auth.cafile)}, certificate "
        f"verified against {shown(Path(auth.cafile))}, the demo's throwaway CA)"
    )
    codes = {
        "no token": client.request("GET", url, auth=client.Auth(cafile=auth.cafile))[0],
        "wrong token": client.request(
            "GET", url, auth=client.Auth(token="x" * 24, cafile=auth.cafile)
        )[0],
        "the token": client.request("GET", url, auth=auth)[0],
    }
    for what, code in codes.items():
        console.line(f"  GET {url} with {what} -> {code}")
    if lb.http_port:
        code, _, _ = client.request("GET", f"http://localhost:{lb.http_port}/v1/model")
        codes["http"] = code
        console.line(f"  GET http://localhost:{lb.http_port}/v1/model -> {code} (to HTTPS)")
    for name, row in sorted(lb.servers().items()):
        console.line(
            f"  haproxy backend {balancer.BACKEND}/{name}: {row['status']}, weight "
            f"{row['weight']}, health check GET /readyz"
        )
    return codes


def benchmark(node: containers.ContainerNode, console: Console, token: str) -> None:
    """The load generator's closed-loop levels against one node, run as the command a user
    would run (`torchfleet-bench load`, benchmarks/torchfleet_bench): the levels live in that
    tool only, and infra keeps just the client of a node's runtime."""
    args = [
        node.url,
        "--concurrency",
        ",".join(map(str, BENCH_LEVELS)),
        "--duration",
        f"{BENCH_SECONDS:g}",
        "--binary",
    ]
    if importlib.util.find_spec("torchfleet_bench") is None:
        console.line("  skipped: torchfleet-bench is not installed here (`make setup` installs it)")
        return
    console.line(f"  $ torchfleet-bench load {' '.join(args)}")
    proc = subprocess.run(
        [sys.executable, "-m", "torchfleet_bench", "load", *args],
        capture_output=True,
        text=True,
        timeout=BENCH_SECONDS * len(BENCH_LEVELS) + 120,
        env=dict(os.environ, TORCHFLEET_API_TOKEN=token),  # never on the command line
    )
    for line in (proc.stdout + proc.stderr).splitlines():
        console.line(f"  {line}")
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    console.line(
        f"  load average {load} on {os.cpu_count()} CPUs while it ran: the client, the "
        "node and everything else on this machine share them"
    )


def short_plan(console: Console) -> None:
    costs = {}
    for stack in PLAN_STACKS:
        run = run_offline(stack, stack_values(stack))
        costs[stack] = run.outputs["cost"]
        kinds = Counter(r.type.split(":")[-1] for r in run.custom())
        hosts = run.outputs["inventory"]["all"]["children"][GROUP].get("hosts") or {}
        console.line(
            f"  {stack}: {len(run.custom())} cloud resources, {len(hosts)} node(s), "
            f"endpoint {run.outputs['endpoint']}"
        )
        console.line("    " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    console.line("")
    for line in cost_rows(costs):
        console.line(f"  {line}")
    console.line("  (the whole tree: make plan STACK=aws-dev)")


NOT_DONE = """\
What this demo did not do
- No cloud: nothing was created in AWS or Alibaba Cloud. The inventory came from the aws-dev
  program under Pulumi's mock engine (make plan); `torchfleet up aws-dev` runs the provision
  stage for real and needs credentials, the Pulumi CLI and a backend (its preflight says which).
- No GPU: the containers have no NVIDIA device, so the driver and CUDA steps skipped themselves
  and the node serves on CPU in fp32 with torch 2.13.0 CPU from the local wheelhouse; the demo
  replaced the stack's GPU facts (L4, cu121, spot) with {facts}.
- No virtual machine: a systemd container on this machine (no cloud-init, no instance metadata,
  so the spot watcher is off; autostop logs instead of powering off).
- No group mode: aws-dev is one instance; HAProxy stood in for the ALB (a cloud stack's
  certificate is an ACM or CLB certificate, not a CA made for the run); the group path (ALB
  target health) is tested against mocked AWS APIs only.
- The benchmark ran on this shared 2-core machine; it says nothing about a GPU node's speed."""


@dataclass
class DemoResult:
    summary: Summary
    nodes: list[containers.ContainerNode]
    prediction_codes: list[int | None]
    balancer_codes: dict[str, int | None]


def clean(console: Console, prefix: str) -> int:
    removed = containers.remove_nodes(prefix)
    state = state_dir(prefix)
    fleet = forget_fleet(prefix)
    if fleet:
        console.line(f"removed the fleet's description and rollout record in {shown(fleet)}")
    if balancer.stop(state / "balancer"):
        console.line("stopped the demo's load balancer (haproxy)")
    console.line(
        f"removed {len(removed)} container(s){': ' + ', '.join(removed) if removed else ''}"
    )
    if state.exists():
        shutil.rmtree(state)
        console.line(f"removed {shown(state)} (keys, inventory, known_hosts, run logs)")
    return 0


def run(
    console: Console, prefix: str, count: int, bench: bool = True, plan: bool = True
) -> DemoResult:
    containers.check_prefix(prefix)
    state = state_dir(prefix)
    state.mkdir(parents=True, exist_ok=True)
    with (state / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two demos of one prefix: one after the other
        return _run(console, prefix, count, bench, plan, state)


def _run(
    console: Console, prefix: str, count: int, bench: bool, plan: bool, state: Path
) -> DemoResult:
    folder = run_dir(SHAPE_STACK, state / "runs")  # as `up`'s .cache/runs/<stack>/<timestamp>/
    console.open_log(folder / "demo.log")
    # the local fleet (nodes and their load balancer), the four node stages of `up`, the edge,
    # predictions, then the optional benchmark and plan
    steps = Steps(console, 7 + bench + plan)
    values = stack_values(SHAPE_STACK, count)
    cfg = stack_config.load(stack_config.raw_from_pulumi_config(values), SHAPE_STACK)
    with steps(
        "nodes",
        f"{count} systemd container node(s) standing in for {SHAPE_STACK}'s "
        f"{cfg.instance_type.name}, HAProxy in front of them standing in for the ALB",
    ):
        missing = containers.missing_tools("podman", "runc", "ssh", "ssh-keygen", "haproxy")
        if missing:
            raise StageError(
                "nodes",
                f"missing tools: {', '.join(missing)}",
                fix="make setup (installs podman, runc, openssh-client, haproxy)",
            )
        console.line(f"  image {containers.ensure_image(console.line)}")
        wheelhouse = containers.ensure_wheelhouse("cp311")
        key = containers.ensure_ssh_key(state / "ssh" / "id_ed25519")
        template = stack_outputs(count)
        login = login_user(template)
        nodes = containers.start_nodes(
            prefix, count, key, login, wheelhouse, state / "known_hosts", state / "models"
        )
        for n in nodes:
            console.line(
                f"  {n.name}  {'started' if n.created else 'reused'}  ssh "
                f"127.0.0.1:{n.ssh_port} ({login}), runtime 127.0.0.1:{n.service_port}, "
                f"address {n.ip}"
            )
        lb = start_balancer(state, nodes)
        console.line(
            f"  haproxy  {lb.endpoint} (HTTPS, TLS 1.2+; HTTP only redirects) -> "
            + ", ".join(b.name for b in lb.backends)
            + ", health checks GET /readyz"
        )
    token = api_token(state)
    auth = client.Auth(token=token, cafile=str(lb.certificates.ca))
    outputs = node_outputs(template, nodes, key)
    outputs["endpoint"] = lb.endpoint + "/"
    outputs["api_token"] = token  # as the stack's secret output
    inventory_root = state / "inventories"
    write_group_vars(inventory_root / SHAPE_STACK, state, key, token)
    # as `up` writes them: the secret output masked (the run folder is a log, not a secret store)
    shown_outputs = automation.Outputs(outputs, frozenset({"api_token"})).masked()
    (folder / "outputs.json").write_text(json.dumps(shown_outputs, indent=2, default=str))
    summary = node_stages(
        SHAPE_STACK,
        outputs,
        cfg,
        steps,
        console,
        folder,
        NodeOptions(
            inventory_root=inventory_root,
            writer="torchfleet demo (mock-engine outputs, container addresses)",
            cafile=auth.cafile,
            smoke_direct=True,
        ),
    )
    with steps("edge", "what a client of the endpoint sees, and what the load balancer sees"):
        for n in nodes:  # each backend up before it is shown
            lb.wait_status(n.name, "UP")
        lb_codes = through_the_balancer(lb, auth, console)
        fleet = describe_fleet(prefix, lb, nodes, auth)
        where = "" if prefix == containers.PREFIX else f" --fleet {shown(fleet.folder)}"
        console.line(
            f"  rollouts: {shown(fleet.folder / FLEET_FILE)} describes these nodes; "
            f"torchfleet rollout {SHAPE_STACK}{where} --model FILE@sha256:HEX (docs/rollouts.md)"
        )
    codes: list[int | None] = []
    with steps("predictions", "JSON, binary and a malformed request to each node's published port"):
        for n in nodes:
            codes += predictions(n, console, auth)
    if bench:
        with steps(
            "benchmark",
            f"closed loop, {BENCH_SECONDS:g} s per level at concurrency "
            f"{','.join(map(str, BENCH_LEVELS))}, binary body",
        ):
            benchmark(nodes[0], console, token)
    if plan:
        with steps("plan", "offline plan and cost of aws-dev and alicloud-dev (mock engine)"):
            short_plan(console)
    summary.notes.append("cost now is what aws-dev would cost: these nodes are containers")
    return DemoResult(summary, nodes, codes, lb_codes)


def not_done() -> str:
    sample = container_host({"torchfleet_instance_type": ""}, "", 0)
    facts = {k: sample[k] for k in REPLACED}
    return NOT_DONE.format(facts=", ".join(f"{k}={v!r}" for k, v in facts.items()))
