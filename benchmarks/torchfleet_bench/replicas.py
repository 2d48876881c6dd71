"""`torchfleet-bench replicas`: model replicas on one machine's CPUs, side by side under wrk,
alternated in the same minutes (a shared machine is noisy).

Variants, every one on the same two CPUs A and B (the process's affinity, `--cpus A,B`):
  1x2    one replica, two torch threads (`--torch-threads 2`): the single-replica path
  1xauto one replica, torch threads auto (the default: 2, or 1 while that serves more)
  2x1    two replicas in one process, each pinned to one CPU with one thread (`--devices A,B`):
         one HTTP edge, one queue, a worker per replica (the runtime's design)
  2proc  two processes on one port with SO_REUSEPORT, each pinned to one CPU with one thread:
         the design not taken. The runtime never sets SO_REUSEPORT, so this benchmark starts
         those processes through a launcher that adds it to asyncio's create_server.
Per round every variant gets fresh servers, a 2 s wrk warm-up and a measured wrk run at each
concurrency; it prints req/s, p50/p99 and the servers' CPU per request, then the medians over
the rounds and the ratios 2x1 / 1x2 and 2proc / 2x1. Results:
benchmarks/results/replicas_cpu.json.

    torchfleet-bench replicas --rounds 3 --seconds 8 --concurrency 1,8,32
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torchfleet_bench.ab import wrk, wrk_inputs
from torchfleet_bench.load import parse_concurrency
from torchfleet_bench.local import cpu_s, free_port
from torchfleet_bench.report import host_info

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

# Two processes on one port: what SO_REUSEPORT would give, for the comparison only.
REUSEPORT_LAUNCHER = """
import asyncio, sys
_create = asyncio.BaseEventLoop.create_server
async def _shared(self, *args, **kwargs):
    kwargs["reuse_port"] = True
    return await _create(self, *args, **kwargs)
asyncio.BaseEventLoop.create_server = _shared
from torchfleet_runtime.cli import main
sys.exit(main())
"""
LAUNCHER = "import sys; from torchfleet_runtime.cli import main; sys.exit(main())"


def variants(a: int, b: int) -> dict[str, list[tuple[set[int], list[str]]]]:
    """name -> its processes: (CPU affinity, extra serve flags) each."""
    both = {a, b}
    return {
        "1x2": [(both, ["--torch-threads", "2"])],
        "1xauto": [(both, [])],
        "2x1": [(both, ["--devices", f"{a},{b}"])],
        "2proc": [({a}, ["--torch-threads", "1"]), ({b}, ["--torch-threads", "1"])],
    }


class Servers:
    """The processes of one variant on one port, each pinned to its CPUs."""

    def __init__(self, model: Path, procs: list[tuple[set[int], list[str]]], logs: Path) -> None:
        self.port = free_port()
        launcher = REUSEPORT_LAUNCHER if len(procs) > 1 else LAUNCHER
        self.logs = [logs / f"server-{i}.log" for i in range(len(procs))]
        self.procs = []
        # the GPU check runs this on whatever Python has the CUDA torch: no zip(strict=) (3.10)
        for i, (cpus, flags) in enumerate(procs):
            log = self.logs[i]
            cmd = [sys.executable, "-c", launcher, "serve", "--model", str(model)]
            cmd += ["--port", str(self.port), "--spot-watch", "off", "--log-format", "json"]
            with open(log, "w") as out:
                self.procs.append(
                    subprocess.Popen(
                        [*cmd, *flags],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        preexec_fn=functools.partial(os.sched_setaffinity, 0, cpus),
                    )
                )

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds until every process logged "ready" (a /readyz poll would reach any one)."""
        t0 = time.monotonic()
        while not all('"msg":"ready"' in p.read_text() for p in self.logs):
            for i, proc in enumerate(self.procs):
                log = self.logs[i]
                if proc.poll() is not None:
                    raise RuntimeError(f"serve exited {proc.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"not ready after {timeout:g} s")
            time.sleep(0.05)
        return time.monotonic() - t0

    def cpu(self) -> float:
        return sum(cpu_s(p.pid) for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(60)


def measure(
    servers: Servers, levels: list[int], seconds: int, env: dict[str, str], lua: Path
) -> dict[int, dict[str, Any]]:
    out = {}
    for conc in levels:
        wrk(servers.port, conc, 2, env, lua)
        c0 = servers.cpu()
        text = wrk(servers.port, conc, seconds, env, lua)
        cpu = servers.cpu() - c0
        n = int(re.search(r"(\d+) requests in", text).group(1))  # type: ignore[union-attr]
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
        lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", text, re.M))
        out[conc] = {
            "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),  # type: ignore[union-attr]
            "p50": lat.get("50"),
            "p99": lat.get("99"),
            "errors": int(non2xx.group(1)) if non2xx else 0,
            "cpu_ms_per_req": round(cpu / max(n, 1) * 1000, 2),
            "load1": round(os.getloadavg()[0], 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="torchfleet-bench replicas", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8, help="wrk seconds per level (default: 8)")
    ap.add_argument("--concurrency", type=parse_concurrency, default=[1, 8, 32])
    ap.add_argument("--cpus", default=None, help="the two CPUs A,B (default: the first two usable)")
    ap.add_argument("--variants", default="1x2,1xauto,2x1,2proc")
    ap.add_argument("--binary", action="store_true", help="raw float32 bodies instead of JSON")
    ap.add_argument("--model", type=Path, help="TorchScript file with its sidecar (default: demo)")
    ap.add_argument("--out", type=Path, default=RESULTS / "replicas_cpu.json")
    args = ap.parse_args(argv)
    mask = sorted(os.sched_getaffinity(0))
    a, b = (int(c) for c in args.cpus.split(",")) if args.cpus else mask[:2]
    chosen = {k: v for k, v in variants(a, b).items() if k in args.variants.split(",")}
    runs: dict[str, list[dict[int, dict[str, Any]]]] = {name: [] for name in chosen}
    ready: dict[str, list[float]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory(prefix="torchfleet-replicas-") as tmp:
        work = Path(tmp)
        model, env, lua = wrk_inputs(work, args.model, args.binary)
        names = list(chosen)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                servers = Servers(model, chosen[name], work)
                try:
                    ready[name].append(round(servers.wait_ready(), 2))
                    res = measure(servers, args.concurrency, args.seconds, env, lua)
                finally:
                    servers.stop()
                runs[name].append(res)
                for conc, v in res.items():
                    print(
                        f"round {r + 1} {name:<7} c={conc:<3} "
                        + " ".join(f"{k} {val}" for k, val in v.items()),
                        flush=True,
                    )
    median = {
        name: {
            conc: statistics.median(run[conc]["rps"] for run in runs[name])
            for conc in args.concurrency
        }
        for name in chosen
    }
    print(
        "\nmedian req/s over",
        args.rounds,
        "rounds (CPUs",
        f"{a},{b};",
        "JSON" if not args.binary else "binary",
        "bodies)",
    )
    print(f"{'variant':<8}" + "".join(f"{'c=' + str(c):>10}" for c in args.concurrency))
    for name in chosen:
        print(f"{name:<8}" + "".join(f"{median[name][c]:>10.1f}" for c in args.concurrency))
    ratios = {}
    for top, bottom in (("2x1", "1x2"), ("2x1", "1xauto"), ("2proc", "2x1")):
        if top in median and bottom in median:
            key = f"{top}/{bottom}"
            ratios[key] = {
                c: round(median[top][c] / median[bottom][c], 2) for c in args.concurrency
            }
            print(f"{key:<12}" + "".join(f"{ratios[key][c]:>10.2f}" for c in args.concurrency))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "host": host_info(),
                "cpus": [a, b],
                "body": "binary" if args.binary else "json",
                "rounds": args.rounds,
                "seconds": args.seconds,
                "ready_s": ready,
                "runs": runs,
                "median_rps": median,
                "ratios": ratios,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.out}")
    return 0
