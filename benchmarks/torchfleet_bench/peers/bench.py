"""`torchfleet-bench peers` (`make bench-peers`): torchfleet-runtime side by side with Mosec, LitServe and TorchServe.

Same TorchScript files, same JSON body of one instance, same closed-loop wrk load (post.lua) at
each concurrency level for every server; each peer from its own pinned virtualenv
(benchmarks/peers/install.sh), its batching configured as its docs recommend, torchfleet with
its defaults. Thread policy: every server and the offline measurement get the same environment
with torch's default thread count; `--omp1-levels` adds runs with OMP_NUM_THREADS=1 for all.

Per model (demo: 1.2 M params, 3x64x64; wide: 11 M params, 3x128x128), per repetition, per
server (order rotated each repetition): start, time start -> ready (the server's own probe),
one request on a fresh connection right after ready, check its answer against the in-process
output (allclose), then per level a warm-up and a measured wrk run. Reported: median [min-max]
of the repetitions of req/s, p50, p99, server CPU per request, errors; peak RSS/PSS of the whole
process tree; start -> ready; first request / steady p50; served / offline; torchfleet / best
peer. Results: benchmarks/results/peers_<model>.json (with the machine, load average at start
and end, and every version).

Usage: torchfleet-bench peers [--models demo,wide] [--repetitions 3] [--duration 4]
       [--warmup 2] [--concurrency 1,8,32,64] [--servers torchfleet,mosec,litserve,torchserve]
       [--omp1-levels 32] [--label baseline]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from torchfleet_bench.local import loopback
from torchfleet_bench.peers import models, proctree, report, wrk
from torchfleet_bench.peers.servers import (
    PEERS,
    PEERS_HOME,
    ROOT,
    SERVERS,
    Server,
    Settings,
    base_env,
    prepare_torchserve,
    venv_python,
)

RESULTS = ROOT / "benchmarks" / "results"
WORK = PEERS_HOME / "work"
RTOL, ATOL = 1e-3, 1e-4  # batching changes the kernels' summation order, nothing more


def log(msg: str) -> None:
    print(msg, flush=True)


def csv_ints(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of integers") from None
    if any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return vals


def csv_choice(allowed: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        vals = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in vals if v not in allowed]
        if bad or not vals:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)}")
        return vals

    return parse


# --------------------------------------------------------------------------- machine, versions


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return {
        "hostname": platform.node(),
        "cpu_model": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
    }


def _out(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    return (p.stdout + p.stderr).strip()


def versions(servers: list[str]) -> dict[str, Any]:
    import torch

    v: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "wrk": _out(["wrk", "--version"]).splitlines()[0] if shutil.which("wrk") else None,
        "torchfleet_runtime": _out(
            [
                sys.executable,
                "-c",
                "import importlib.metadata as m; print(m.version('torchfleet-runtime'))",
            ]
        ),
        "torchfleet_commit": _out(["git", "-C", str(ROOT), "rev-parse", "HEAD"]),
        "runtime_dirty": bool(_out(["git", "-C", str(ROOT), "status", "--porcelain", "runtime"])),
    }
    for peer in PEERS:
        if peer not in servers:
            continue
        dists = {"torchserve": ["torchserve", "torch-model-archiver"]}.get(peer, [peer])
        code = (
            "import importlib.metadata as m, json, platform, torch; print(json.dumps({"
            + ", ".join(f"{d!r}: m.version({d!r})" for d in dists)
            + ", 'torch': torch.__version__, 'python': platform.python_version()}))"
        )
        raw = _out([str(venv_python(peer)), "-W", "ignore", "-c", code]).splitlines()
        try:
            v[peer] = json.loads(raw[-1])
        except (ValueError, IndexError):
            v[peer] = {"error": " ".join(raw)[-300:]}
        install = PEERS_HOME / peer / "install.json"
        if install.exists():
            v[peer]["install"] = json.loads(install.read_text())
    if "torchserve" in servers:
        v["java"] = _out(["java", "-version"]).splitlines()[0]
    return v


# --------------------------------------------------------------------------- one server run


# Requests after the first, each on a fresh connection like it: the same client's steady time,
# so first / that is the server's own first-request cost (first / wrk's p50 also counts the
# Python client's connect and send, about 2 ms on the demo body).
FRESH_REPEATS = 5


def first_request(
    srv: Server,
    body: bytes,
    expected: list[float],
    timeout: float,
    tolerance: tuple[float, float] = (RTOL, ATOL),
) -> dict[str, Any]:
    """One POST on a fresh connection right after ready. A server that is "ready" but cannot
    answer yet is retried every 50 ms (its figure then shows the gap); its answer must match.
    Then FRESH_REPEATS more the same way (`fresh_ms`)."""

    def post() -> tuple[int | None, bytes, float]:
        t = time.perf_counter()
        status, data = loopback(srv.port, "POST", srv.predict_path, body, timeout=timeout)
        return status, data, round((time.perf_counter() - t) * 1000, 2)

    t0 = time.perf_counter()
    status, data, first_ms = post()
    out: dict[str, Any] = {"first_request_ms": first_ms, "first_status": status}
    while status != 200 and time.perf_counter() - t0 < timeout:
        time.sleep(0.05)
        status, data, _ = post()
    out["first_ok_after_ms"] = round((time.perf_counter() - t0) * 1000, 2)
    if status != 200:
        raise RuntimeError(
            f"{srv.name}: no 200 within {timeout:g} s of ready (last {status}: {data[:300]!r})"
        )
    out.update(check_answer(srv.name, data, expected, tolerance))
    out["fresh_ms"] = []
    for _ in range(FRESH_REPEATS):
        status, data, ms = post()
        if status != 200:
            raise RuntimeError(f"{srv.name}: {status} after its first answer: {data[:300]!r}")
        out["fresh_ms"].append(ms)
    return out


def check_answer(
    name: str,
    data: bytes,
    expected: list[float],
    tolerance: tuple[float, float] = (RTOL, ATOL),
) -> dict[str, Any]:
    """The answer's outputs allclose to `expected` at (rtol, atol) `tolerance`."""
    rtol, atol = tolerance
    try:
        got = json.loads(data)["outputs"]
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"{name}: the answer has no 'outputs': {data[:300]!r}") from None
    if len(got) != len(expected):
        raise RuntimeError(f"{name}: {len(got)} outputs, expected {len(expected)}")
    diff = max(abs(a - b) for a, b in zip(got, expected, strict=True))
    if not all(
        math.isclose(a, b, rel_tol=rtol, abs_tol=atol) for a, b in zip(got, expected, strict=True)
    ):
        raise RuntimeError(
            f"{name}: the answer differs from the in-process output (max |diff| {diff:.3g})"
        )
    return {"correct": True, "max_abs_diff": diff}


def run_server(
    name: str, model: models.ModelFiles, settings: Settings, rep: int, args: argparse.Namespace
) -> dict[str, Any]:
    key = report.run_key(name, settings.threads)
    levels = args.concurrency if settings.threads == "default" else args.omp1_levels
    work = WORK / model.name / f"run-{key.replace('@', '-')}-{rep}"
    if work.exists():
        shutil.rmtree(work)
    run: dict[str, Any] = {
        "key": key,
        "server": name,
        "threads": settings.threads,
        "repetition": rep,
        "levels": [],
    }
    srv = Server(name, model, work, settings)
    body = model.body.read_bytes()
    url = f"http://127.0.0.1:{srv.port}{srv.predict_path}"
    try:
        srv.start()
        with proctree.PeakSampler(srv.pid) as mem:
            run["start_to_ready_s"] = round(srv.wait_ready(args.ready_timeout), 3)
            run.update(first_request(srv, body, model.expected_outputs(), args.request_timeout))
            run["idle_rss_mb"] = round(mem.sample()[0], 1)
            if name == "torchfleet":
                info = loopback(srv.port, "GET", "/v1/model")[1]
                run["model_info"] = {
                    k: v
                    for k, v in json.loads(info or b"{}").items()
                    if k in ("max_batch_size", "batch_cap_method", "warmed_batch_sizes")
                }
            log(
                f"  [{key} rep {rep}] ready {run['start_to_ready_s']:.2f} s, first request "
                f"{run['first_request_ms']:.1f} ms (status {run['first_status']}), answer ok"
                + (
                    f", max_batch_size {run['model_info'].get('max_batch_size')}"
                    if "model_info" in run
                    else ""
                )
            )
            for c in levels:
                if args.warmup > 0:
                    wrk.run(url, model.body, c, args.warmup, args.wrk_threads, args.request_timeout)
                # wrk abandons its in-flight requests when it stops; a server that computes them
                # anyway would spend the measured window on them (and a bounded queue would
                # answer 503): measure from a quiet server
                quiet_s = quiesce(srv.pid, args.quiesce_max)
                cpu0 = proctree.cpu_s(srv.pid)
                res, raw = wrk.run(
                    url, model.body, c, args.duration, args.wrk_threads, args.request_timeout
                )
                cpu = proctree.cpu_s(srv.pid) - cpu0
                lv = {"concurrency": c, **res.as_dict(), "quiesce_s": quiet_s}
                # fewer answers than connections: the latency is longer than the window
                lv["underfilled"] = res.requests < c
                lv["cpu_ms_per_req"] = round(cpu * 1000 / res.requests, 2) if res.requests else None
                if args.keep_wrk_output:
                    lv["wrk_stdout"] = raw
                run["levels"].append(lv)
                lat = res.latency_ms
                log(
                    f"    c={c:<3} {res.req_per_s:7.1f} req/s  p50 {lat['p50'] or 0:7.1f}  "
                    f"p99 {lat['p99'] or 0:7.1f} ms"
                    f"  cpu/req {lv['cpu_ms_per_req'] or 0:6.2f} ms  errors {res.errors}"
                )
            # SIGTERM -> exit is timed from an idle server, not one still computing what the
            # last wrk run abandoned
            run["quiesce_before_stop_s"] = quiesce(srv.pid, args.quiesce_max)
            run["peak_rss_mb"] = round(mem.peak_rss_mb, 1)
            run["peak_pss_mb"] = round(mem.peak_pss_mb, 1)
            run["processes"] = mem.max_processes
    except (RuntimeError, wrk.WrkError, OSError, subprocess.CalledProcessError) as exc:
        run["error"] = str(exc)[-1500:]
        log(f"  [{key} rep {rep}] FAILED: {run['error']}")
    finally:
        stop = srv.stop()
        run.update(
            {
                k: stop[k]
                for k in ("sigterm_to_exit_s", "root_exit_s", "killed", "exit_code")
                if k in stop
            }
        )
    if "error" not in run:
        shutil.rmtree(work, ignore_errors=True)  # logs kept only for failed runs
    return run


def quiesce(pid: int, limit_s: float, window_s: float = 0.25, idle_cores: float = 0.1) -> float:
    """Wait until the tree uses under `idle_cores` of CPU over a window (at most `limit_s`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        c0 = proctree.cpu_s(pid)
        time.sleep(window_s)
        if proctree.cpu_s(pid) - c0 < idle_cores * window_s:
            break
    return round(time.monotonic() - t0, 2)


def offline(
    model: models.ModelFiles, threads: str, seconds: float, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The child process of peers/offline.py; `extra`: its other options (--device, --batches)."""
    env = base_env(Settings(threads=threads))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchfleet_bench.peers.offline",
            str(model.model),
            "--shape",
            ",".join(map(str, model.input_shape)),
            "--seconds",
            str(seconds),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if p.returncode != 0:
        raise RuntimeError(f"offline measurement failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def offline_text(o: dict[str, Any]) -> str:
    """The file's best batch (what the peers run) and that of the graph torchfleet serves."""
    sg = o["served_graph"]
    return (
        f"best {o['best']['items_per_s']:.1f} items/s at batch {o['best']['batch']}; "
        f"torchfleet's graph ({sg['optimization'].get('method') or 'as loaded'}) "
        f"{sg['best']['items_per_s']:.1f} at batch {sg['best']['batch']}"
    )


# --------------------------------------------------------------------------- main


def bench_model(name: str, args: argparse.Namespace, t_begin: float) -> dict[str, Any]:
    work = WORK / name
    log(f"\n== model {name}: building the TorchScript file, the body and the expected answer")
    model = models.build(name, WORK)
    settings_list = [Settings("default", args.peer_batch, args.peer_wait_ms)]
    if args.omp1_levels:
        settings_list.append(Settings("1", args.peer_batch, args.peer_wait_ms))
    result: dict[str, Any] = {
        "label": args.label,
        "tool": "torchfleet-bench peers",
        "model": {
            "name": name,
            "parameters": model.parameters,
            "input_shape": list(model.input_shape),
            "body_bytes": model.body.stat().st_size,
            "file": "see benchmarks/torchfleet_bench/peers/models.py",
        },
        "machine": machine(),
        "load_average": {"start": loadavg()},
        "config": {
            "servers": args.servers,
            "repetitions": args.repetitions,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "concurrency": args.concurrency,
            "omp1_levels": args.omp1_levels,
            "wrk_threads": args.wrk_threads,
            "request_timeout_s": args.request_timeout,
            "peer_batching": {"max_batch_size": args.peer_batch, "max_wait_ms": args.peer_wait_ms},
            "thread_policy": "every server and the offline measurement: torch's default threads "
            "(OMP/MKL_NUM_THREADS unset); the @omp1 rows set OMP_NUM_THREADS=MKL_NUM_THREADS=1 for all",
            "correctness": f"first answer allclose(rtol={RTOL}, atol={ATOL}) to the in-process output",
        },
        "offline": {},
        "runs": [],
    }
    if "torchserve" in args.servers:
        prepare_torchserve(model, work, settings_list[0])
    for s in settings_list:
        log(f"offline best-batch throughput (threads: {s.threads}) ...")
        result["offline"][s.threads] = off = offline(model, s.threads, args.offline_seconds)
        log(f"  {offline_text(off)} ({off['threads']} torch threads)")
    for rep in range(1, args.repetitions + 1):
        for s in settings_list:
            order = args.servers[rep - 1 :] + args.servers[: rep - 1]  # rotate: no fixed position
            for srv in order:
                if time.monotonic() - t_begin > args.max_minutes * 60:
                    result["runs"].append(
                        {
                            "key": report.run_key(srv, s.threads),
                            "server": srv,
                            "threads": s.threads,
                            "repetition": rep,
                            "error": f"skipped: over --max-minutes {args.max_minutes:g}",
                        }
                    )
                    continue
                log(
                    f"-- {name} rep {rep}/{args.repetitions}: {report.run_key(srv, s.threads)}  (load {loadavg()[0]})"
                )
                result["runs"].append(run_server(srv, model, s, rep, args))
    result["load_average"]["end"] = loadavg()
    result["summary"] = summary = report.summarize(result["runs"])
    offline_best = {t: o["best"]["items_per_s"] for t, o in result["offline"].items()}
    served_best = {
        t: o["served_graph"]["best"]["items_per_s"] for t, o in result["offline"].items()
    }
    result["ratios"] = rat = report.ratios(summary, offline_best, served_best)
    if args.omp1_levels:
        result["ratios"]["omp1_changes_ranking"] = report.ranking_changes(rat)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="torchfleet-bench peers", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--models", type=csv_choice(models.MODELS), default=list(models.MODELS))
    ap.add_argument("--servers", type=csv_choice(SERVERS), default=list(SERVERS))
    ap.add_argument(
        "--repetitions", type=int, default=3, help="runs per server (median reported; default 3)"
    )
    ap.add_argument(
        "--duration", type=float, default=4.0, help="measured seconds per level (default 4)"
    )
    ap.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        help="seconds of load before each level, discarded (default 2)",
    )
    ap.add_argument(
        "--concurrency", type=csv_ints, default=[1, 8, 32, 64], help="levels (default 1,8,32,64)"
    )
    ap.add_argument(
        "--omp1-levels",
        type=lambda t: csv_ints(t) if t else [],
        default=[32],
        help="levels also run with OMP_NUM_THREADS=1 for every server ('' for none; default 32)",
    )
    ap.add_argument(
        "--peer-batch", type=int, default=16, help="the peers' max batch size (default 16)"
    )
    ap.add_argument(
        "--peer-wait-ms", type=float, default=10.0, help="the peers' max batch wait (default 10 ms)"
    )
    ap.add_argument(
        "--wrk-threads",
        type=int,
        default=2,
        help="wrk threads (default 2; at most the connections)",
    )
    ap.add_argument(
        "--quiesce-max",
        type=float,
        default=15.0,
        help="after each warm-up, wait up to this long for the server to go idle (default 15)",
    )
    ap.add_argument(
        "--offline-seconds", type=float, default=1.0, help="seconds per offline batch size"
    )
    ap.add_argument("--ready-timeout", type=float, default=180.0)
    ap.add_argument(
        "--request-timeout", type=float, default=30.0, help="wrk --timeout and the first request's"
    )
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=40.0,
        help="start no server run after this (default 40)",
    )
    ap.add_argument("--label", default="", help="e.g. baseline: stored in the results")
    ap.add_argument(
        "--note", default="", help="free text stored in the results (e.g. what else ran)"
    )
    ap.add_argument(
        "--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)"
    )
    ap.add_argument(
        "--keep-wrk-output", action="store_true", help="store wrk's raw stdout per level"
    )
    args = ap.parse_args(argv)
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, so every started server is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.repetitions < 1 or args.duration <= 0:
        ap.error("--repetitions must be >= 1 and --duration > 0")
    if not shutil.which("wrk"):
        ap.error("wrk is not installed: run benchmarks/peers/install.sh (or apt-get install wrk)")
    t_begin = time.monotonic()
    per_level = args.warmup + args.duration
    est = (
        len(args.models)
        * args.repetitions
        * len(args.servers)
        * (len(args.concurrency) * per_level + len(args.omp1_levels) * per_level + 2 * 12)
    )
    log(
        f"peer benchmark: {', '.join(args.servers)} on {', '.join(args.models)}; about {est / 60:.0f} min "
        f"(load average now {loadavg()})"
    )
    vers = versions(args.servers)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        result = bench_model(name, args, t_begin)
        result["versions"] = vers
        result["note"] = args.note
        result["elapsed_s"] = round(time.monotonic() - t_begin, 1)
        title = (
            f"== peers, model {name} ({result['model']['parameters'] / 1e6:.1f} M params, "
            f"{'x'.join(map(str, result['model']['input_shape']))}, "
            f"{result['model']['body_bytes'] / 1000:.0f} KB JSON); "
            f"{result['machine']['cpus']} CPUs {result['machine']['cpu_model']}; "
            f"load {result['load_average']['start']} -> "
            f"{result['load_average']['end']}; {args.repetitions} reps x {args.duration:g} s"
            + (f"; {args.label}" if args.label else "")
        )
        log("\n" + report.render(result["summary"], result["ratios"], title))
        for t, o in result["offline"].items():
            log(f"offline ({t} threads): {offline_text(o)}")
        if "omp1_changes_ranking" in result["ratios"]:
            log(
                f"OMP_NUM_THREADS=1 changes the ranking at: {result['ratios']['omp1_changes_ranking']}"
            )
        out = args.out / f"peers_{name}.json"
        out.write_text(json.dumps(result, indent=1) + "\n")
        log(f"wrote {out}")
    log(f"total {time.monotonic() - t_begin:.0f} s")
    return 0
