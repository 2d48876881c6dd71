"""`torchfleet-bench edges`: the CPU proxy of the edge processes, a near-zero-cost model served
with `edge_workers` 1 against 2 (or any list), JSON and binary bodies, alternated per round.

The model (a TorchScript slice of its input, the demo model's input shape 3x64x64) costs next
to nothing, so what is measured is the edge: HTTP, decoding the body, the hand-off, encoding.
Per variant it starts `torchfleet-runtime serve --edge-workers N`, waits for /readyz, runs the
closed-loop client of `torchfleet-bench load` (levels.run_level) at each concurrency, then reads
the resident memory of the owner and of each edge process before stopping it. It prints req/s,
p50/p99 and the RSS of every process, and writes the JSON report with --json.

    torchfleet-bench edges --workers 0,1,2 --concurrency 16 --seconds 5 --rounds 2 \\
        --json benchmarks/results/edges_cpu.json

The client runs on the same CPUs as the server: compare the variants within one run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from infra.client import Auth, Target, build_payload
from torchfleet_bench.levels import run_level
from torchfleet_bench.load import parse_concurrency
from torchfleet_bench.local import free_port, loopback
from torchfleet_bench.report import host_info

SHAPE = (3, 64, 64)


def parse_workers(text: str) -> list[int]:
    try:
        out = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        out = []
    if not out or any(n < 0 for n in out):
        raise argparse.ArgumentTypeError(
            f"--workers {text!r}: expected a comma-separated list of integers >= 0, e.g. 0,1,2"
        )
    return out


def write_model(work: Path) -> Path:
    """A TorchScript model that returns ten numbers of each instance: no arithmetic to speak of."""
    import torch

    class Slice(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1)[:, :10] * 1.0

    path = work / "slice.pt"
    torch.jit.script(Slice()).save(str(path))
    path.with_suffix(".json").write_text(
        json.dumps({"input_shape": list(SHAPE), "version": "slice"})
    )
    return path


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def edge_pids(owner: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2 :].split()[1]) == owner and b".edge" in cmd:
            out.append(int(entry))
    return sorted(out)


def serve(model: Path, workers: int, port: int, log: Path) -> subprocess.Popen[bytes]:
    cli = str(Path(sys.executable).with_name("torchfleet-runtime"))
    return subprocess.Popen(
        [
            cli,
            "serve",
            "--model",
            str(model),
            "--port",
            str(port),
            "--edge-workers",
            str(workers),
            "--spot-watch",
            "off",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        if loopback(port, "GET", "/readyz", timeout=2)[0] == 200:
            return
        time.sleep(0.2)
    raise RuntimeError("the server was not ready in time")


def run_variant(
    model: Path, workers: int, binary: bool, levels: list[int], seconds: float, log: Path
) -> dict[str, Any]:
    port = free_port()
    proc = serve(model, workers, port, log)
    try:
        wait_ready(port, proc)
        target = Target.parse(f"http://127.0.0.1:{port}", Auth())
        body, headers = build_payload(SHAPE, "float32", 1, binary)
        out: dict[str, Any] = {"edge_workers": workers, "body": "binary" if binary else "json"}
        out["levels"] = [
            asdict(run_level(target, body, headers, c, 1, duration_s=seconds, warmup=20))
            for c in levels
        ]
        out["rss_mb"] = {"owner": rss_mb(proc.pid)}
        for i, pid in enumerate(edge_pids(proc.pid)):
            out["rss_mb"][f"edge{i}"] = rss_mb(pid)
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def row(r: dict[str, Any]) -> str:
    lv = r["levels"]
    cells = " ".join(
        f"c={x['concurrency']}: {x['throughput_rps']:7.1f} req/s p50 "
        f"{x['latency_ms']['p50'] or 0:6.1f} p99 {x['latency_ms']['p99'] or 0:6.1f} ms"
        for x in lv
    )
    rss = ", ".join(f"{k} {v:.0f}" for k, v in r["rss_mb"].items())
    return f"{r['body']:<6} edges={r['edge_workers']}  {cells}  RSS MB: {rss}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="torchfleet-bench edges", description=__doc__)
    ap.add_argument(
        "--workers",
        type=parse_workers,
        default=[1, 2],
        metavar="N[,N...]",
        help="edge_workers values (0: the edge in the owner's process, as before)",
    )
    ap.add_argument("--concurrency", type=parse_concurrency, default=[16], metavar="N[,N...]")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per level")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, variants alternated in each")
    ap.add_argument("--json", dest="json_out", metavar="OUT", help="write the report here")
    args = ap.parse_args(argv)
    report: dict[str, Any] = {
        "tool": "torchfleet-bench edges",
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": host_info(),
        "config": {
            "workers": args.workers,
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "input_shape": list(SHAPE),
        },
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="torchfleet-edges-") as tmp:
        work = Path(tmp)
        model = write_model(work)
        for rnd in range(args.rounds):
            for binary in (False, True):
                for n in args.workers:
                    r = run_variant(
                        model, n, binary, args.concurrency, args.seconds, work / "serve.log"
                    )
                    r["round"] = rnd
                    report["runs"].append(r)
                    print(row(r), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json_out}")
    return 0
