"""`torchfleet-bench gpu-peers`: torchfleet-runtime side by side with Mosec on a GPU machine, in
one call of a few minutes (issue 28): the same TorchScript files and JSON bodies as `make
bench-peers` (demo and wide models), `wrk` on the same machine.

Configurations (each one server process tree, started once per model):
- `torchfleet@edge1`, `torchfleet@edge-auto`: the runtime with its defaults on `--device`, the
  environment `TORCHFLEET_EDGE_WORKERS` at 1 and `auto` (a runtime without edge processes ignores
  it: the process count beside each figure says how many there were); JSON and binary bodies
  (`X-Shape`/`X-Dtype`, infra.client's payload);
- `mosec@decode1`, `mosec@decodeN`: benchmarks/peers/apps/mosec_app.py with 1 and N decode
  processes feeding one batched inference process on the same device; JSON bodies (its app's
  contract).
At each concurrency (`--concurrency`): a warm-up, then a measured wrk run: req/s, p50/p99
and the peak RSS/PSS of the server's whole process tree during it. Per model also the offline
ceiling (the file as loaded, on the device, at `--offline-batches`, synchronised) and each served
figure over it. The table shows, per level, torchfleet's best over Mosec's best. When the
`pipeline` command exists (the GPU pipeline's offline eager/staged/graphs figures) it is run and
stored too, else recorded as not available.

A time budget (`--budget-s`) skips what would not fit, and says so in the results. Results:
OUT/gpu_peers_<device>.json. Run on a bare GPU machine through `torchfleet-bench gpu-pack`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.client import build_payload
from torchfleet_bench import cli
from torchfleet_bench.peers import bench as peers_bench
from torchfleet_bench.peers import models, proctree, wrk
from torchfleet_bench.peers.bench import (
    csv_ints,
    first_request,
    loadavg,
    machine,
    quiesce,
)
from torchfleet_bench.peers.servers import ROOT, Server, Settings, venv_python

OURS = "torchfleet"
PEER = "mosec"
BODIES = ("json", "binary")
OFFLINE_BATCHES = [64, 256]
DEFAULT_OUT = ROOT / ".cache" / "gpu-peers"
# The expected answer is computed on the CPU; on a GPU, cuDNN's convolutions run in TF32 by
# PyTorch's default (a 10-bit mantissa), so the first answer is checked at a looser tolerance.
GPU_TOLERANCE = (2e-2, 2e-2)  # (rtol, atol)


def tolerance(device: str) -> tuple[float, float]:
    """(rtol, atol) of the first answer's check on `device`."""
    return GPU_TOLERANCE if device == "cuda" else (peers_bench.RTOL, peers_bench.ATOL)


START_S = 15.0  # a server's start to ready, about (a GPU machine: torch import, CUDA, warm-up)


@dataclass(frozen=True)
class Config:
    """One server configuration of the side by side."""

    key: str
    server: str
    bodies: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


def configs(device: str, decode_workers: list[int]) -> list[Config]:
    out = [
        Config(
            f"{OURS}@edge{e if e != 'auto' else '-auto'}",
            OURS,
            BODIES,
            {"TORCHFLEET_DEVICE": device, "TORCHFLEET_EDGE_WORKERS": e},
        )
        for e in ("1", "auto")
    ]
    out += [
        Config(
            f"{PEER}@decode{n}",
            PEER,
            ("json",),
            {"PEERS_DEVICE": device, "PEERS_DECODE_WORKERS": str(n)},
        )
        for n in decode_workers
    ]
    return out


# --------------------------------------------------------------------------- report (pure)


def rows(models_result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (model, body, concurrency): each configuration's figures, torchfleet's best
    and Mosec's best req/s, their ratio and served / offline (over the best offline batch)."""
    out = []
    for name, m in models_result.items():
        best_offline = max(
            (r["items_per_s"] for r in (m.get("offline") or {}).get("results", [])), default=None
        )
        cells: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
        for run in m.get("runs", []):
            for lv in run.get("levels", []):
                if lv.get("skipped"):
                    continue
                cells.setdefault((lv["body"], lv["concurrency"]), {})[run["key"]] = {
                    "req_per_s": lv["req_per_s"],
                    "p50_ms": lv["latency_ms"].get("p50"),
                    "p99_ms": lv["latency_ms"].get("p99"),
                    "errors": lv["errors"],
                    "rss_mb": lv.get("rss_mb"),
                    "processes": lv.get("processes"),
                }
        for (body, c), figs in sorted(
            cells.items(), key=lambda kv: (BODIES.index(kv[0][0]), kv[0][1])
        ):

            def best(
                server: str, figs: dict[str, dict[str, Any]] = figs
            ) -> tuple[str, float] | None:
                mine = [(k, f["req_per_s"]) for k, f in figs.items() if k.split("@")[0] == server]
                return max(mine, key=lambda kv: kv[1]) if mine else None

            ours, peer = best(OURS), best(PEER)
            row: dict[str, Any] = {
                "model": name,
                "body": body,
                "concurrency": c,
                "figures": figs,
                "best_torchfleet": ours[0] if ours else None,
                "best_mosec": peer[0] if peer else None,
                "ratio": round(ours[1] / peer[1], 3) if ours and peer and peer[1] else None,
                "served_over_offline": round(ours[1] / best_offline, 4)
                if ours and best_offline
                else None,
            }
            out.append(row)
    return out


def _cell(f: dict[str, Any] | None) -> str:
    if not f:
        return "-"

    def ms(v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v:.0f}" if v >= 10 else f"{v:.2g}"

    rss = "-" if f.get("rss_mb") is None else f"{f['rss_mb']:.0f}"
    err = f", {f['errors']} err" if f.get("errors") else ""
    return f"{f['req_per_s']:.0f} ({ms(f['p50_ms'])}/{ms(f['p99_ms'])} ms, {rss} MB{err})"


def render(table: list[dict[str, Any]], keys: list[str]) -> str:
    """Markdown: one row per (model, body, c); each configuration's req/s (p50/p99, peak RSS of
    its process tree); torchfleet's best / Mosec's best; torchfleet's best / offline ceiling."""
    head = ["model", "body", "c", *keys, "torchfleet / best Mosec", "served / offline"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in table:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        so = "-" if r["served_over_offline"] is None else f"{r['served_over_offline']:.3f}"
        cells = [_cell(r["figures"].get(k)) for k in keys]
        lines.append(
            "| "
            + " | ".join([r["model"], r["body"], str(r["concurrency"]), *cells, ratio, so])
            + " |"
        )
    return "\n".join(lines)


def offline_text(name: str, off: dict[str, Any]) -> str:
    rows_ = ", ".join(f"batch {r['batch']} {r['items_per_s']:.0f}" for r in off.get("results", []))
    return f"offline ceiling {name}: {rows_} items/s"


# --------------------------------------------------------------------------- running


def log(msg: str) -> None:
    print(msg, flush=True)


def mosec_python(given: Path | None) -> Path:
    """The interpreter Mosec runs in: the one given, this one when it imports mosec (a pack's
    --target on PYTHONPATH), else Mosec's venv of `make bench-peers`."""
    if given:
        return given
    if importlib.util.find_spec("mosec") is not None:
        return Path(sys.executable)
    return venv_python(PEER)


def offline(
    model: models.ModelFiles, device: str, seconds: float, batches: list[int]
) -> dict[str, Any]:
    """The file as loaded, on the device, at each batch size (torch's default threads)."""
    extra = ("--batches", ",".join(map(str, batches)), "--device", device, "--file-only")
    return peers_bench.offline(model, "default", seconds, extra)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.t0 = time.monotonic()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)


def run_config(
    cfg: Config,
    model: models.ModelFiles,
    bodies: dict[str, tuple[Path, dict[str, str]]],
    args: argparse.Namespace,
    budget: Budget,
    work: Path,
) -> dict[str, Any]:
    run: dict[str, Any] = {"key": cfg.key, "server": cfg.server, "env": cfg.env, "levels": []}
    # wrk takes whole seconds; a level also waits for an idle server
    per_level = math.ceil(args.warmup) + math.ceil(args.duration) + 1.0
    settings = Settings(
        max_batch=args.peer_batch,
        max_wait_ms=args.peer_wait_ms,
        env=cfg.env,
        python=args.mosec_python if cfg.server == PEER else None,
    )
    srv = Server(cfg.server, model, work / cfg.key.replace("@", "-"), settings)
    url = f"http://127.0.0.1:{srv.port}{srv.predict_path}"
    try:
        srv.start()
        with proctree.PeakSampler(srv.pid) as mem:
            run["start_to_ready_s"] = round(srv.wait_ready(args.ready_timeout), 3)
            tol = tolerance(args.device)
            run.update(
                first_request(srv, model.body.read_bytes(), model.expected_outputs(), 30.0, tol)
            )
            run["idle_rss_mb"] = round(mem.sample()[0], 1)
            log(f"  [{cfg.key}] ready {run['start_to_ready_s']:.2f} s, answer ok")
            for body in cfg.bodies:
                path, headers = bodies[body]
                for c in args.concurrency:
                    lv: dict[str, Any] = {"body": body, "concurrency": c}
                    if budget.left() < per_level:
                        lv["skipped"] = f"over --budget-s {args.budget_s:g}"
                        run["levels"].append(lv)
                        continue
                    if args.warmup > 0:  # whole seconds: wrk takes no fractions
                        wrk.run(url, path, c, args.warmup, args.wrk_threads, 10.0, headers)
                    lv["quiesce_s"] = quiesce(srv.pid, args.quiesce_max)
                    with proctree.PeakSampler(srv.pid, interval=0.1) as level_mem:
                        res, _ = wrk.run(
                            url, path, c, args.duration, args.wrk_threads, 10.0, headers
                        )
                    lv.update(res.as_dict())
                    lv["rss_mb"] = round(level_mem.peak_rss_mb, 1)
                    lv["pss_mb"] = round(level_mem.peak_pss_mb, 1)
                    lv["processes"] = level_mem.max_processes
                    run["levels"].append(lv)
                    lat = res.latency_ms
                    log(
                        f"    {body:<6} c={c:<3} {res.req_per_s:8.1f} req/s  p50 {lat['p50'] or 0:7.1f}"
                        f"  p99 {lat['p99'] or 0:7.1f} ms  RSS {lv['rss_mb']:.0f} MB"
                        f" ({lv['processes']} proc)  errors {res.errors}"
                    )
            run["peak_rss_mb"] = round(mem.peak_rss_mb, 1)
            run["processes"] = mem.max_processes
    except (RuntimeError, wrk.WrkError, OSError) as exc:
        run["error"] = str(exc)[-1500:]
        log(f"  [{cfg.key}] FAILED: {run['error']}")
    finally:
        stop = srv.stop()
        run["sigterm_to_exit_s"] = stop.get("sigterm_to_exit_s")
    return run


def pipeline(device: str, out: Path, timeout_s: float) -> dict[str, Any]:
    """The GPU pipeline's offline figures (`torchfleet-bench pipeline`), where that command exists."""
    if "pipeline" not in cli.COMMANDS:
        return {"status": "not available", "why": "no `pipeline` command in this tree"}
    target = out / f"pipeline_{device}.json"
    cmd = [
        sys.executable,
        "-m",
        "torchfleet_bench",
        "pipeline",
        "--device",
        device,
        "--json",
        str(target),
    ]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "timed out", "seconds": timeout_s}
    if p.returncode != 0 or not target.exists():
        return {"status": f"failed ({p.returncode})", "stderr": (p.stderr or p.stdout)[-1500:]}
    return {"status": "ok", "result": json.loads(target.read_text())}


def versions(mosec_py: Path) -> dict[str, Any]:
    import torch

    def dist(py: Path, name: str) -> str:
        p = subprocess.run(
            [str(py), "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return p.stdout.strip() or f"unavailable: {p.stderr.strip()[-200:]}"

    wrk_v = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torchfleet_runtime": dist(Path(sys.executable), "torchfleet-runtime"),
        "mosec": dist(mosec_py, "mosec"),
        "wrk": (wrk_v.splitlines() or ["?"])[0],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="torchfleet-bench gpu-peers", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="default cuda; cpu for a dry run"
    )
    ap.add_argument("--models", default=",".join(models.MODELS), help="demo,wide (default both)")
    ap.add_argument(
        "--concurrency", type=csv_ints, default=[32, 128, 256], help="default 32,128,256"
    )
    cores = os.cpu_count() or 1
    ap.add_argument(
        "--decode-workers",
        type=csv_ints,
        default=sorted({1, min(8, cores)}),
        help=f"Mosec's decode processes, one configuration each (default 1,{min(8, cores)})",
    )
    ap.add_argument(
        "--duration", type=float, default=4.0, help="measured seconds per level (default 4)"
    )
    ap.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of load before each level (default 1)"
    )
    ap.add_argument(
        "--quiesce-max", type=float, default=3.0, help="wait for an idle server (default 3 s)"
    )
    ap.add_argument(
        "--wrk-threads", type=int, default=min(4, cores), help=f"default {min(4, cores)}"
    )
    ap.add_argument("--peer-batch", type=int, default=64, help="Mosec's max batch (default 64)")
    ap.add_argument(
        "--peer-wait-ms", type=float, default=5.0, help="Mosec's max wait (default 5 ms)"
    )
    ap.add_argument("--offline-seconds", type=float, default=1.0, help="per offline batch size")
    ap.add_argument(
        "--offline-batches",
        type=csv_ints,
        default=OFFLINE_BATCHES,
        help="offline ceiling's batch sizes (default 64,256; smaller for a CPU dry run)",
    )
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument(
        "--budget-s", type=float, default=320.0, help="skip levels past this (default 320 s)"
    )
    ap.add_argument("--pipeline-timeout", type=float, default=60.0)
    ap.add_argument("--mosec-python", type=Path, default=None, help="interpreter with mosec")
    ap.add_argument("--label", default="", help="stored in the results (e.g. 'CPU dry run')")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    bad = [n for n in names if n not in models.MODELS]
    if bad or not names:
        from torchfleet_compat.problems import sentence

        ap.error(sentence("--models", args.models, ", ".join(models.MODELS)))
    if not shutil.which("wrk"):
        ap.error(
            "wrk is not on PATH: build a pack with `torchfleet-bench gpu-pack` (or apt-get install wrk)"
        )
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: torch sees no CUDA device here (--device cpu for a dry run)")
    args.mosec_python = mosec_python(args.mosec_python)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    budget = Budget(args.budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    cfgs = configs(args.device, args.decode_workers)
    result: dict[str, Any] = {
        "tool": "torchfleet-bench gpu-peers",
        "label": args.label,
        "device": args.device,
        "machine": machine(),
        "load_average": {"start": loadavg()},
        "versions": versions(args.mosec_python),
        "config": {
            "models": names,
            "concurrency": args.concurrency,
            "configurations": [
                {"key": c.key, "bodies": list(c.bodies), "env": c.env} for c in cfgs
            ],
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "wrk_threads": args.wrk_threads,
            "mosec_batching": {"max_batch_size": args.peer_batch, "max_wait_ms": args.peer_wait_ms},
            "offline_batches": args.offline_batches,
            "budget_s": args.budget_s,
            "first_answer_tolerance": tolerance(args.device),
        },
        "models": {},
    }
    log(
        f"gpu-peers on {args.device}: {', '.join(c.key for c in cfgs)}; models {', '.join(names)}; "
        f"c={','.join(map(str, args.concurrency))}; budget {args.budget_s:g} s"
    )
    skipped = f"over --budget-s {args.budget_s:g}"
    for name in names:
        log(f"\n== model {name}")
        model = models.build(name, work)
        binary, headers = build_payload(
            model.input_shape, "float32", 1, True, decimals=models.DECIMALS
        )
        bin_path = work / name / "body.bin"
        bin_path.write_bytes(binary)
        bodies = {"json": (model.body, {}), "binary": (bin_path, headers)}
        m: dict[str, Any] = {
            "model": {
                "parameters": model.parameters,
                "input_shape": list(model.input_shape),
                "json_body_bytes": model.body.stat().st_size,
                "binary_body_bytes": len(binary),
            },
            "runs": [],
        }
        result["models"][name] = m
        try:
            m["offline"] = off = offline(
                model, args.device, args.offline_seconds, args.offline_batches
            )
            log(offline_text(name, off))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            m["offline"] = {"error": str(exc)[-1500:]}
        for cfg in cfgs:
            # a server that could not measure one level before the budget ends is not started
            if budget.left() < START_S + args.warmup + args.duration:
                m["runs"].append({"key": cfg.key, "server": cfg.server, "skipped": skipped})
                log(f"-- {name}: {cfg.key} skipped: {skipped}")
                continue
            log(f"-- {name}: {cfg.key} (load {loadavg()[0]}, {budget.left():.0f} s left)")
            m["runs"].append(run_config(cfg, model, bodies, args, budget, work))
    result["pipeline"] = (
        pipeline(args.device, args.out, min(args.pipeline_timeout, max(budget.left(), 0)))
        if budget.left() > 5
        else {"status": "skipped", "why": f"over --budget-s {args.budget_s:g}"}
    )
    result["load_average"]["end"] = loadavg()
    result["table"] = table = rows(result["models"])
    result["elapsed_s"] = round(time.monotonic() - budget.t0, 1)
    keys = [c.key for c in cfgs]
    log(
        f"\n== gpu-peers on {args.device} ({result['machine']['cpus']} CPUs, {result['machine']['cpu_model']})"
    )
    log(render(table, keys))
    log(f"pipeline: {result['pipeline']['status']}")
    out = args.out / f"gpu_peers_{args.device}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    log(f"wrote {out} ({result['elapsed_s']:.0f} s)")
    failed = [r["key"] for m in result["models"].values() for r in m["runs"] if r.get("error")]
    return 1 if failed else 0
