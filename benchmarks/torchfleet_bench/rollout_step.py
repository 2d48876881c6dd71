"""`torchfleet-bench rollout-step`: one weight step of a group-mode rollout, timed under Pulumi's
mock engine, moved two ways (three timings):

- `up`: the split's `rollout.candidate_weight` written and the whole `torchfleet up` pipeline
  run (preflight, provision, inventory, readiness, smoke: infra/deploy/pipeline.py), what a
  group-mode step did before the targeted step existed;
- `targeted`: the same config change applied by the targeted step (infra/deploy/split.py): a
  `pulumi up` whose targets are the resources the new split changes, then the candidate's
  readiness and a prediction through the endpoint; cold (the step runs the program under the
  mock engine for the config before and after to find its targets: a rollout's first weight
  step after the candidate's file was placed) and `targeted-warm` (the run of the config before
  is the one the step before kept: a step after a step).

What is real: the pipeline's and the step's own code (preflight's checks against this
process's environment, with a stand-in `pulumi` on PATH that answers `version` and `whoami`,
prices from the reference table), the Pulumi program run by the mock engine (infra.offline)
for every `pulumi up`, and the smoke prediction over HTTP on loopback. What stands in: the
Automation API's stack (`MockEngineStack`: its `up` is the program under the mock engine, the
stack's outputs with the endpoint pointed at the loopback server), the load balancer (that
server, answering /v1/model and /v1/predict), the group's health (as many healthy targets as
its desired size at once: no node boot is timed) and Cost Explorer. So the figure is what the
controller itself spends per step, not a cloud's apply or boot time.

The paths alternate round by round (the machine is shared: compare within one run).
"""

from __future__ import annotations

import argparse
import http.server
import io
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pulumi import automation as auto

PATHS = ("up", "targeted", "targeted-warm")
FAKE_PULUMI = """#!/bin/sh
while [ "${1#--}" != "$1" ]; do shift; done
case "$1" in
  version) echo v3.272.0 ;;
  whoami) echo '{"user":"bench","url":"file:///tmp/state"}' ;;
  *) echo "bench pulumi: refusing '$*'" >&2; exit 97 ;;
esac
"""
CARD = {"input_shape": [3], "dtype": "float32", "model_version": "sha256:000000000000"}


class MockEngineStack:
    """The Automation API's Stack as `up` and the split use it; `up` runs the program under the
    mock engine with the stack's current config and returns its outputs (the endpoint pointed at
    `endpoint`). `targets` records what each `up` targeted (None: the whole stack)."""

    def __init__(self, stack: str, values: dict[str, Any], endpoint: str) -> None:
        self.stack, self.values, self.endpoint = stack, values, endpoint
        self.workspace = SimpleNamespace(env_vars={})
        self.targets: list[list[str] | None] = []
        self._outputs: dict[str, Any] = {}

    def get_all_config(self) -> dict[str, auto.ConfigValue]:
        return {
            k: auto.ConfigValue(v if isinstance(v, str) else json.dumps(v))
            for k, v in self.values.items()
        }

    def set_config(self, key: str, value: auto.ConfigValue, *, path: bool = False) -> None:
        self.values[key] = json.loads(value.value)

    def run(self) -> Any:
        """The program under the mock engine with the current config (an infra.offline
        OfflineRun); its outputs become the stack's."""
        from infra.offline import run_offline

        run = run_offline(self.stack, dict(self.values))
        self._outputs = {**run.outputs, "endpoint": self.endpoint}
        return run

    def up(self, target: list[str] | None = None, **_: Any) -> auto.UpResult:
        self.run()
        self.targets.append(target)
        return auto.UpResult(stdout="", stderr="", summary=None, outputs=self.outputs())  # type: ignore[arg-type]

    def outputs(self) -> dict[str, auto.OutputValue]:
        return {k: auto.OutputValue(v, k == "api_token") for k, v in self._outputs.items()}


class _Balancer(http.server.BaseHTTPRequestHandler):
    """The load balancer's stand-in: a model card and a prediction per request."""

    def do_GET(self) -> None:
        self._answer(CARD)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer({"outputs": [[0.0, 1.0]]})

    def _answer(self, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def balancer() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Balancer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def bench_machine(folder: Path) -> Iterator[None]:
    """This process as a machine where `torchfleet up` passes its preflight: a stand-in `pulumi`
    first on PATH, a self-managed backend with a passphrase, AWS keys, reference prices; the
    runs' logs and inventories under `folder`; the group healthy at once; no Cost Explorer."""
    from infra import spend
    from infra.deploy import pipeline, readiness

    bindir = folder / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / "pulumi").write_text(FAKE_PULUMI)
    (bindir / "pulumi").chmod(0o755)
    env = {
        "PATH": f"{bindir}:{os.environ.get('PATH', '')}",
        "PULUMI_BACKEND_URL": f"file://{folder / 'state'}",
        "PULUMI_CONFIG_PASSPHRASE": "bench-only",
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "TORCHFLEET_PRICES": "offline",
    }
    saved_env = {k: os.environ.get(k) for k in env}
    saved = (pipeline.RUNS, pipeline.INVENTORIES, readiness.aws_group_health, spend.ce_client)
    os.environ.update(env)
    pipeline.RUNS, pipeline.INVENTORIES = folder / "runs", folder / "inventories"

    def healthy(stack: str, outputs: dict[str, Any], client: Any = None) -> Any:
        return readiness.GroupHealth(1, 1, {"i-bench": "healthy"})

    class NoBill:
        def update_cost_allocation_tags_status(self, **_: Any) -> dict[str, Any]:
            return {"Errors": []}

    readiness.aws_group_health = healthy
    spend.ce_client = NoBill
    try:
        yield
    finally:
        pipeline.RUNS, pipeline.INVENTORIES, readiness.aws_group_health, spend.ce_client = saved
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _splits(stack: str, handle: MockEngineStack, console: Any) -> dict[str, Callable[[], Any]]:
    """path -> a CloudSplit over `handle` that moves the split that way (a path not built in
    this checkout is left out)."""
    from infra.deploy import automation, pipeline
    from infra.rollout.cloud import CloudSplit

    setattr(automation, "open_stack", lambda name: handle)  # noqa: B010 (a stand-in, not a Stack)
    say = lambda _: None  # noqa: E731

    def whole() -> Any:
        return CloudSplit(handle, lambda: pipeline.up(stack, console), tracks=None, say=say)  # type: ignore[arg-type]

    splits: dict[str, Callable[[], Any]] = {"up": whole}
    try:
        from infra.deploy.split import TargetedStep, config_values
    except ImportError:
        return splits
    from infra import config

    raw = {k.split(":", 1)[1]: v for k, v in handle.values.items()}
    cfg = config.load(raw, stack)

    def targeted(warm: bool) -> Any:
        def refuse() -> None:
            raise AssertionError("the targeted path ran the whole `up`")

        # a new step each round: cold, neither config's program run is known yet (two runs for
        # the targets: a rollout's first weight step after the candidate's file was placed);
        # warm, the config before is (one run: a step after a step, whose run the step keeps)
        step = TargetedStep(stack, handle, cfg, console)
        if warm:
            step.plan(config_values(handle.get_all_config()))
        return CloudSplit(handle, refuse, tracks=None, say=say, step=step)  # type: ignore[arg-type]

    splits["targeted"] = lambda: targeted(False)
    splits["targeted-warm"] = lambda: targeted(True)
    return splits


def measure(
    stack: str, rounds: int, shares: tuple[int, int], say: Callable[[str], None]
) -> dict[str, Any]:
    from infra.deploy.progress import Console
    from infra.rollout.cloud import KEY
    from infra.rollout.policy import split
    from infra.stacks import load_stack_config

    base = load_stack_config(stack)
    block = {
        "candidate_weight": shares[0],
        "candidate_model": "c" * 64 + ".pt",
        "stable_model": "5" * 64 + ".pt",
    }
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    targets: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, balancer() as endpoint, bench_machine(Path(tmp)):
        handle = MockEngineStack(stack, {**base, KEY: block}, endpoint)
        console = Console(io.StringIO(), live=False)
        splits = _splits(stack, handle, console)
        built = [p for p in PATHS if p in splits]
        handle.up()  # the stack as the step before left it (and the mock engine warm)
        sp = split(shares[1], 2)
        weights = {"candidate": sp.candidate_weight, "stable": sp.stable_weight}
        for _ in range(rounds):
            for path in built:
                handle.values[KEY] = dict(block)
                cloud = splits[path]()
                handle.targets.clear()
                started = time.perf_counter()
                cloud.set_weights(weights)
                times[path].append(time.perf_counter() - started)
                targets[path] = handle.targets[-1]
                assert handle.values[KEY]["candidate_weight"] == shares[1]
    result: dict[str, Any] = {"stack": stack, "step": f"{shares[0]} % -> {shares[1]} %"}
    for path in PATHS:
        if not times[path]:
            say(f"{path:>13}: not built in this checkout")
            continue
        t = sorted(times[path])
        result[path] = {
            "rounds": len(t),
            "median_s": round(statistics.median(t), 3),
            "min_s": round(t[0], 3),
            "max_s": round(t[-1], 3),
            "targets": None if targets[path] is None else len(targets[path]),
        }
        what = (
            "the whole stack"
            if targets[path] is None
            else f"{len(targets[path])} targeted resource(s)"
        )
        say(
            f"{path:>13}: median {statistics.median(t):.3f} s (min {t[0]:.3f}, max {t[-1]:.3f}) "
            f"over {len(t)} rounds; pulumi up of {what}"
        )
    if "median_s" in result.get("up", {}) and "median_s" in result.get("targeted", {}):
        ratio = result["targeted"]["median_s"] / result["up"]["median_s"]
        result["targeted_over_up"] = round(ratio, 3)
        say(f"targeted / up: {ratio:.2f}")
    if "median_s" in result.get("up", {}) and "median_s" in result.get("targeted-warm", {}):
        ratio = result["targeted-warm"]["median_s"] / result["up"]["median_s"]
        result["targeted_warm_over_up"] = round(ratio, 3)
        say(f"targeted-warm / up: {ratio:.2f}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="torchfleet-bench rollout-step", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--stack", default="aws-prod", help="a mode: group stack (default aws-prod)")
    p.add_argument("--rounds", type=int, default=5, help="rounds per path (default 5)")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    say(f"rollout-step on {args.stack}: one weight step, 10 % -> 25 %, under the mock engine")
    result = measure(args.stack, max(1, args.rounds), (10, 25), say)
    result.update(host=os.uname().nodename, cpus=os.cpu_count(), load=os.getloadavg()[0])
    result["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
