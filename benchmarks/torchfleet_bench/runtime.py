"""`torchfleet-bench runtime` (`make bench`): the runtime's numbers on this machine, with the demo
model.

What it measures (issue 3, "Measure and report"), each with real `torchfleet-runtime serve`
processes over HTTP on loopback and the closed loop of `levels.py`:
  1. offline ceiling: in-process best-batch items/s of the same TorchScript model;
  2. served items/s at concurrency 1, 8, 32, 64 — with dynamic batching (max_batch_size auto)
     and without (max_batch_size 1), each with a JSON and a binary request body;
  3. ratios: served / offline, batching on / off, binary / JSON;
  4. time from process start to /readyz 200, and the first request after ready / steady p50;
  5. time from SIGTERM to exit (drain);
  6. with wrk installed (Debian: wrk): the batching server at c=8/32/64 under wrk, with JSON and
     binary bodies, p50/p99 and the server's CPU per request (from /proc); and the overhead of the
     per-stage instrumentation: servers with `stage_timing` on and off, alternated, at c=32.
Client and server share this machine's CPUs (as they would not in production): the figures
are a floor, and each run records the load average it started under.

Results go to benchmarks/results/runtime_bench_<device>.json (+ .png with matplotlib).
Total time is bounded by --budget-s (default 300 s): levels that would not fit are skipped
and marked so. Usage: torchfleet-bench runtime [--device cuda] [--duration 4]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from infra.client import Target, build_payload, post_once
from torchfleet_bench.levels import run_level
from torchfleet_bench.load import parse_concurrency
from torchfleet_bench.local import cpu_s, free_port, loopback
from torchfleet_bench.report import host_info

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
CONFIGS: tuple[tuple[str, list[str]], ...] = (  # name, extra serve flags
    ("batching", []),  # max_batch_size auto: the runtime's default
    ("no-batching", ["--max-batch-size", "1"]),
)
BODIES = ("json", "binary")


def log(msg: str) -> None:
    print(msg, flush=True)


def runtime_cmd(*args: str) -> list[str]:
    """The CLI through this interpreter, so the benchmark needs no PATH set-up."""
    return [
        sys.executable,
        "-c",
        "import sys; from torchfleet_runtime.cli import main; sys.exit(main())",
        *args,
    ]


TORCH_THREADS: int | None = None  # --threads; None: the runtime's auto (one per CPU)


def child_env() -> dict[str, str]:
    """The server and offline processes get the same OpenMP settings, so served / offline compares
    like with like: the runtime's OpenMP wait policy (PASSIVE unless the environment says
    otherwise, see torchfleet_runtime.cli) and, with --threads, the same intra-op thread count."""
    from torchfleet_runtime.cli import OMP_DEFAULTS

    env = dict(os.environ)
    for key, value in OMP_DEFAULTS.items():
        env.setdefault(key, value)
    if TORCH_THREADS:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(TORCH_THREADS)
    return env


def thread_flags() -> list[str]:
    return ["--torch-threads", str(TORCH_THREADS)] if TORCH_THREADS else []


def batch_counters(port: int) -> tuple[float, float]:
    """(sum, count) of torchfleet_batch_size: their deltas give the mean batch of a level."""
    _, body = loopback(port, "GET", "/metrics")
    total = count = 0.0
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("torchfleet_batch_size_sum"):
            total = float(line.split()[-1])
        elif line.startswith("torchfleet_batch_size_count"):
            count = float(line.split()[-1])
    return total, count


class Server:
    """One `torchfleet-runtime serve` process, timed from spawn to ready and from SIGTERM to exit."""

    def __init__(self, model: Path, device: str, extra: list[str], logfile: Path) -> None:
        self.port = free_port()
        self.logfile = logfile
        self._log = open(logfile, "w")  # noqa: SIM115 - closed in stop()
        cmd = runtime_cmd(
            "serve",
            "--model",
            str(model),
            "--port",
            str(self.port),
            "--device",
            device,
            "--log-level",
            "warning",
            *thread_flags(),
            *extra,
        )
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=child_env()
        )

    def wait_ready(self, timeout: float) -> float:
        """Seconds from spawn to the first /readyz 200 (polled every 10 ms: a benchmark, not a
        test, and the poll interval bounds the error of the figure)."""
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.tail()}")
            status, _ = loopback(self.port, "GET", "/readyz", timeout=1.0)
            if status == 200:
                return time.monotonic() - self.started
            if time.monotonic() - self.started > timeout:
                raise RuntimeError(f"serve not ready after {timeout:g} s:\n{self.tail()}")
            time.sleep(0.01)

    def stop(self, timeout: float = 60.0) -> dict[str, Any]:
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = None
        self._log.close()
        return {"exit_code": rc, "sigterm_to_exit_s": round(time.monotonic() - t0, 3)}

    def cpu_s(self) -> float:
        """The server process's user + system CPU seconds so far."""
        return cpu_s(self.proc.pid)

    def tail(self, n: int = 3000) -> str:
        self._log.flush()
        return self.logfile.read_text(errors="replace")[-n:]


def first_request_ms(port: int, body: bytes, headers: dict[str, str]) -> float:
    """One request on a fresh connection, right after /readyz turned 200."""
    target = Target("http", "127.0.0.1", port, "")
    conn = target.connection(60.0)
    try:
        t0 = time.perf_counter()
        status, data, _ = post_once(conn, "/v1/predict", body, headers)
        elapsed = (time.perf_counter() - t0) * 1000
    finally:
        conn.close()
    if status != 200:
        raise RuntimeError(f"first request answered {status}: {data[:300]!r}")
    return round(elapsed, 3)


# --------------------------------------------------------------------------- wrk

WRK_LUA = """
local f = io.open(os.getenv("TORCHFLEET_BODY"), "rb")
wrk.body = f:read("*all")
f:close()
wrk.method = "POST"
for k, v in string.gmatch(os.getenv("TORCHFLEET_HEADERS"), "([^=;]+)=([^;]*)") do wrk.headers[k] = v end
"""
_WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _wrk_ms(text: str) -> float | None:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    return float(m.group(1)) * _WRK_UNITS[m.group(2)] if m else None


def wrk_level(
    server: Server, body: bytes, headers: dict[str, str], conc: int, seconds: float, work: Path
) -> dict[str, Any]:
    """One wrk run (one thread, closed loop, `conc` connections): req/s, p50/p99 and the server's
    CPU per request over exactly that run."""
    body_file, lua = work / "wrk-body", work / "wrk.lua"
    body_file.write_bytes(body)
    lua.write_text(WRK_LUA)
    env = {
        **os.environ,
        "TORCHFLEET_BODY": str(body_file),
        "TORCHFLEET_HEADERS": ";".join(f"{k}={v}" for k, v in headers.items()),
    }
    url = f"http://127.0.0.1:{server.port}/v1/predict"
    load = round(os.getloadavg()[0], 2)
    cpu0 = server.cpu_s()
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{conc}",
            f"-d{max(1, round(seconds))}s",
            "--latency",
            "--timeout",
            "10s",
            "-s",
            str(lua),
            url,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=seconds + 60,
    ).stdout
    cpu = server.cpu_s() - cpu0
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    n = re.search(r"(\d+) requests in", out)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    requests = int(n.group(1)) if n else 0
    return {
        "concurrency": conc,
        "requests": requests,
        "rps": float(rps.group(1)) if rps else 0.0,
        "p50_ms": _wrk_ms(lat.get("50", "")),
        "p99_ms": _wrk_ms(lat.get("99", "")),
        "non_2xx": int(bad.group(1)) if bad else 0,
        "server_cpu_ms_per_req": round(cpu / requests * 1000, 3) if requests else None,
        "load1": load,
    }


def overhead(
    model: Path,
    device: str,
    payload: tuple[bytes, dict[str, str]],
    seconds: float,
    rounds: int,
    work: Path,
) -> dict[str, Any]:
    """stage_timing on vs off at c=32, alternated in the same minutes: -> the off / on ratio."""
    runs: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            server = Server(
                model,
                device,
                ["--stage-timing", "true" if mode == "on" else "false"],
                work / f"serve-overhead-{mode}.log",
            )
            try:
                server.wait_ready(300)
                wrk_level(server, *payload, 32, 1, work)  # warm: connections, batch sizes
                level = wrk_level(server, *payload, 32, seconds, work)
                runs[mode].append(level["rps"])
                log(
                    f"  stage_timing {mode:<3} c=32 {level['rps']:8.1f} req/s  p99 {fmt(level['p99_ms'], '.1f')} ms  "
                    f"cpu {fmt(level['server_cpu_ms_per_req'], '.2f')} ms/req  load {level['load1']}"
                )
            finally:
                server.stop()
    on, off = statistics.median(runs["on"]), statistics.median(runs["off"])
    return {
        "rounds": rounds,
        "seconds": seconds,
        "rps": runs,
        "median_on": on,
        "median_off": off,
        "on_over_off": ratio(on, off),
    }


def offline(model: Path, device: str, seconds: float, workdir: Path) -> dict[str, Any]:
    """In a child process, so this (client) process never holds a CUDA context or torch threads
    busy while a server runs."""
    out = workdir / "offline.json"
    cmd = [
        sys.executable,
        "-m",
        "torchfleet_bench",
        "load",
        "--offline",
        str(model),
        "--device",
        device,
        "--offline-seconds",
        str(seconds),
        "--json",
        str(out),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=child_env(), cwd=ROOT
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"offline benchmark failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    for line in proc.stdout.splitlines():
        if line.startswith("  offline batch"):
            log(line)
    return json.loads(out.read_text())["offline"]


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """The ratios the issue asks for, from the raw runs."""
    best = report["offline"]["best"]["items_per_s"]
    runs = report["servers"]

    def items(cfg: str, body: str, conc: int) -> float | None:
        for lv in runs.get(cfg, {}).get("levels", {}).get(body, []):
            if lv["concurrency"] == conc:
                return lv["items_per_s"]
        return None

    concs = report["config"]["concurrency"]
    out: dict[str, Any] = {
        "offline_best_items_per_s": best,
        "offline_best_batch": report["offline"]["best"]["batch"],
        "served_over_offline": {
            f"{cfg}/{body}": {str(c): ratio(items(cfg, body, c), best) for c in concs}
            for cfg, _ in CONFIGS
            for body in BODIES
        },
        "batching_on_over_off": {
            body: {
                str(c): ratio(items("batching", body, c), items("no-batching", body, c))
                for c in concs
            }
            for body in BODIES
        },
        "binary_over_json": {
            cfg: {str(c): ratio(items(cfg, "binary", c), items(cfg, "json", c)) for c in concs}
            for cfg, _ in CONFIGS
        },
        "start_to_ready_s": {cfg: runs[cfg]["start_to_ready_s"] for cfg in runs},
        "first_request_over_steady_p50": {},
        "sigterm_to_exit_s": {cfg: runs[cfg]["stop"]["sigterm_to_exit_s"] for cfg in runs},
    }
    for cfg, run in runs.items():
        steady = next(
            (
                lv["latency_ms"]["p50"]
                for lv in run["levels"].get("json", [])
                if lv["concurrency"] == 1
            ),
            None,
        )
        out["first_request_over_steady_p50"][cfg] = {
            "first_ms": run["first_request_ms"],
            "steady_p50_ms": steady,
            "ratio": ratio(run["first_request_ms"], steady),
        }
    return out


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def print_rows(
    report: dict[str, Any], concs: list[str], cell: Callable[[dict[str, Any]], str]
) -> None:
    """One row per server config and body kind, one column per concurrency level."""
    for cfg, _ in CONFIGS:
        for body in BODIES:
            lvls = {
                str(lv["concurrency"]): lv
                for lv in report["servers"].get(cfg, {}).get("levels", {}).get(body, [])
            }
            log(
                f"{cfg + ' ' + body:<22}"
                + "".join(f"{cell(lvls[c]) if c in lvls else '-':>10}" for c in concs)
            )


def print_summary(report: dict[str, Any]) -> None:
    s = report["summary"]
    concs = [str(c) for c in report["config"]["concurrency"]]
    log("")
    log(
        f"== runtime benchmark: {report['config']['device']}, demo model "
        f"{'x'.join(map(str, report['config']['input_shape']))}, {report['host'].get('cpus')} CPUs "
        f"(load {report['host'].get('loadavg_1m')} at start), {report['config']['duration_s']:g} s per level, "
        f"torch threads {report['config']['torch_threads']}"
    )
    log(
        f"offline best: {s['offline_best_items_per_s']:.1f} items/s at batch {s['offline_best_batch']}"
    )
    log(f"{'items/s':<22}" + "".join(f"{'c=' + c:>10}" for c in concs))
    print_rows(report, concs, lambda lv: fmt(lv["items_per_s"], ".1f"))
    log(f"{'p99 ms':<22}")
    print_rows(report, concs, lambda lv: fmt(lv["latency_ms"]["p99"], ".1f"))
    log(f"{'mean batch formed':<22}")
    print_rows(report, concs, lambda lv: fmt(lv.get("mean_batch"), ".2f"))
    log("ratios")
    for key, rows in (
        ("served / offline", s["served_over_offline"]),
        ("batching on / off", s["batching_on_over_off"]),
        ("binary / json", s["binary_over_json"]),
    ):
        for name, vals in rows.items():
            log(f"{key + ' ' + name:<40}" + "".join(f"{fmt(vals.get(c)):>8}" for c in concs))
    for cfg, run in report["servers"].items():
        model = run.get("model", {})
        log(
            f"{cfg:<12} max_batch_size {model.get('max_batch_size')} ({model.get('batch_cap_method', '?')}), "
            f"warmed batch sizes {model.get('warmed_batch_sizes')}"
        )
    for cfg in s["start_to_ready_s"]:
        fr = s["first_request_over_steady_p50"][cfg]
        log(
            f"{cfg:<12} start->ready {s['start_to_ready_s'][cfg]:.2f} s; first request {fmt(fr['first_ms'], '.1f')} ms"
            f" / steady p50 {fmt(fr['steady_p50_ms'], '.1f')} ms = {fmt(fr['ratio'])}; "
            f"SIGTERM->exit {s['sigterm_to_exit_s'][cfg]:.2f} s"
        )
    wrk = report["servers"].get("batching", {}).get("wrk")
    if wrk:
        log(
            f"wrk (batching server; JSON body {report['config'].get('wrk_json_body_bytes')} bytes): "
            "req/s, p50 / p99 ms, server CPU ms per request"
        )
        for body, levels in wrk.items():
            log(
                f"  {body:<7}"
                + "".join(
                    f"  c={lv['concurrency']}: {lv['rps']:.1f} req/s "
                    f"{fmt(lv['p50_ms'], '.1f')}/{fmt(lv['p99_ms'], '.1f')} ms "
                    f"{fmt(lv['server_cpu_ms_per_req'], '.2f')} ms"
                    for lv in levels
                )
            )
    inst = report.get("instrumentation")
    if inst:
        log(
            f"instrumentation: stage_timing on / off at c=32 = {fmt(inst['on_over_off'], '.3f')} "
            f"(median {inst['median_on']:.1f} vs {inst['median_off']:.1f} req/s over {inst['rounds']} rounds)"
        )


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tp, ax_lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    for cfg, _ in CONFIGS:
        for body in BODIES:
            lvls = report["servers"].get(cfg, {}).get("levels", {}).get(body, [])
            if not lvls:
                continue
            style = "-" if cfg == "batching" else ":"
            conc = [lv["concurrency"] for lv in lvls]
            ax_tp.plot(
                conc, [lv["items_per_s"] for lv in lvls], style, marker="o", label=f"{cfg} {body}"
            )
            ax_lat.plot(
                conc,
                [lv["latency_ms"]["p99"] or math.nan for lv in lvls],
                style,
                marker="o",
                label=f"{cfg} {body}",
            )
    best = report["offline"]["best"]
    ax_tp.axhline(
        best["items_per_s"],
        color="grey",
        linestyle="--",
        label=f"offline best (batch {best['batch']})",
    )
    ax_tp.set(title="Throughput", xlabel="concurrency", ylabel="items/s")
    ax_lat.set(title="p99 latency", xlabel="concurrency", ylabel="ms")
    ax_lat.set_yscale("log")
    for ax in (ax_tp, ax_lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(report["config"]["concurrency"])
        ax.set_xticklabels([str(c) for c in report["config"]["concurrency"]])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    host = report["host"]
    fig.suptitle(
        f"torchfleet-runtime, demo model on {report['config']['device']} "
        f"({host.get('cpus')} CPUs, {host.get('cpu_model', '')})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="torchfleet-bench runtime", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    ap.add_argument("--concurrency", type=parse_concurrency, default=[1, 8, 32, 64])
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per level (default: 4)")
    ap.add_argument(
        "--offline-seconds", type=float, default=1.0, help="seconds per offline batch size"
    )
    ap.add_argument(
        "--budget-s", type=float, default=300.0, help="skip levels past this total (default: 300)"
    )
    ap.add_argument(
        "--ready-timeout", type=float, default=300.0, help="seconds to wait for /readyz"
    )
    ap.add_argument(
        "--out", type=Path, default=RESULTS, help="results folder (default: benchmarks/results)"
    )
    ap.add_argument(
        "--batching-cap",
        type=int,
        default=None,
        metavar="N",
        help="max_batch_size of the batching server (default: auto, the runtime's own sizing)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="OMP_NUM_THREADS for the server and offline processes (default: torch's own)",
    )
    ap.add_argument(
        "--no-plot", action="store_true", help="skip the PNG even if matplotlib is present"
    )
    ap.add_argument(
        "--model",
        type=Path,
        help="a TorchScript file with its .json sidecar (default: the demo model)",
    )
    ap.add_argument(
        "--wrk-seconds", type=float, default=5.0, help="seconds per wrk level (default: 5)"
    )
    ap.add_argument(
        "--overhead-rounds",
        type=int,
        default=3,
        help="stage_timing on/off rounds at c=32 (default: 3; 0 skips)",
    )
    ap.add_argument(
        "--no-wrk", action="store_true", help="skip the wrk levels and the overhead rounds"
    )
    args = ap.parse_args(argv)
    use_wrk = not args.no_wrk and shutil.which("wrk") is not None
    global TORCH_THREADS
    TORCH_THREADS = args.threads
    t_begin = time.monotonic()
    tag = "cuda" if args.device.startswith("cuda") else args.device
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "tool": "torchfleet-bench runtime",
        "host": host_info(),
        "config": {
            "device": args.device,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "torch_threads": args.threads or "default",
            "bodies": list(BODIES),
            "configs": {n: f for n, f in CONFIGS},
        },
        "servers": {},
        "skipped": [],
    }
    with tempfile.TemporaryDirectory(prefix="torchfleet-bench-") as tmp:
        work = Path(tmp)
        if args.model:
            model = args.model.resolve()
        else:
            subprocess.run(
                runtime_cmd("demo-model", str(work / "model")),
                check=True,
                stdout=subprocess.DEVNULL,
            )
            model = work / "model" / "model.pt"
        meta = json.loads(model.with_suffix(".json").read_text())
        shape, dtype = tuple(meta["input_shape"]), meta.get("dtype", "float32")
        report["config"].update(input_shape=list(shape), dtype=dtype, model=meta.get("name"))
        report["torch"] = _torch_version()

        log(f"offline best-batch throughput on {args.device} ...")
        report["offline"] = offline(model, args.device, args.offline_seconds, work)
        log(
            f"offline best: {report['offline']['best']['items_per_s']:.1f} items/s at batch "
            f"{report['offline']['best']['batch']}"
        )

        payloads = {body: build_payload(shape, dtype, 1, body == "binary") for body in BODIES}
        # wrk sends what clients of image models send: pixels rounded to 4 decimals in JSON
        wrk_payloads = {
            body: build_payload(shape, dtype, 1, body == "binary", decimals=4) for body in BODIES
        }
        report["config"]["wrk_json_body_bytes"] = len(wrk_payloads["json"][0])
        configs = [
            (
                name,
                ["--max-batch-size", str(args.batching_cap)]
                if name == "batching" and args.batching_cap
                else flags,
            )
            for name, flags in CONFIGS
        ]
        report["config"]["configs"] = dict(configs)
        for cfg, extra in configs:
            log(f"serve [{cfg}] {' '.join(extra) or '(max_batch_size auto)'} ...")
            server = Server(model, args.device, extra, work / f"serve-{cfg}.log")
            run: dict[str, Any] = {"flags": extra, "levels": {}}
            try:
                run["start_to_ready_s"] = round(server.wait_ready(args.ready_timeout), 3)
                run["first_request_ms"] = first_request_ms(server.port, *payloads["json"])
                _, info = loopback(server.port, "GET", "/v1/model")
                run["model"] = json.loads(info or b"{}")
                log(
                    f"  ready after {run['start_to_ready_s']:.2f} s; first request {run['first_request_ms']:.1f} ms; "
                    f"max_batch_size {run['model'].get('max_batch_size')}, "
                    f"warmed {run['model'].get('warmed_batch_sizes')}"
                )
                if cfg == "batching" and run["model"].get("max_batch_size") == 1:
                    log(
                        "  NOTE: the auto batch cap came out as 1 (the warm-up measured batch 2 over the "
                        "latency budget: a loaded machine?), so batching on == off here; --batching-cap N forces one"
                    )
                target = Target("http", "127.0.0.1", server.port, "")
                for body in BODIES:
                    levels = run["levels"].setdefault(body, [])
                    for conc in args.concurrency:
                        if time.monotonic() - t_begin + args.duration + 5 > args.budget_s:
                            report["skipped"].append(
                                f"{cfg}/{body}/c={conc}: over --budget-s {args.budget_s:g}"
                            )
                            continue
                        before = batch_counters(server.port)
                        level = asdict(
                            run_level(
                                target,
                                *payloads[body],
                                concurrency=conc,
                                batch=1,
                                duration_s=args.duration,
                                warmup=1,
                            )
                        )
                        after = batch_counters(server.port)
                        runs = after[1] - before[1]
                        level["mean_batch"] = (
                            round((after[0] - before[0]) / runs, 2) if runs else None
                        )
                        levels.append(level)
                        lat = level["latency_ms"]
                        log(
                            f"  {body:<6} c={conc:<3} {level['items_per_s']:8.1f} items/s  "
                            f"p50 {fmt(lat['p50'], '.1f')} p99 {fmt(lat['p99'], '.1f')} ms  "
                            f"errors {level['errors'] or '-'}  mean batch {level['mean_batch']}"
                        )
                if use_wrk and cfg == "batching":
                    run["wrk"] = {}
                    for body in BODIES:
                        wrk_level(server, *wrk_payloads[body], 8, 1, work)  # warm-up
                        run["wrk"][body] = []
                        for conc in (8, 32, 64):
                            lv = wrk_level(
                                server, *wrk_payloads[body], conc, args.wrk_seconds, work
                            )
                            run["wrk"][body].append(lv)
                            log(
                                f"  wrk {body:<6} c={conc:<3} {lv['rps']:8.1f} req/s  p50 {fmt(lv['p50_ms'], '.1f')} "
                                f"p99 {fmt(lv['p99_ms'], '.1f')} ms  "
                                f"server cpu {fmt(lv['server_cpu_ms_per_req'], '.2f')} "
                                f"ms/req  non-2xx {lv['non_2xx']}  load {lv['load1']}"
                            )
            except RuntimeError as exc:
                log(f"  [{cfg}] failed: {exc}")
                run["error"] = str(exc)
            finally:
                run["stop"] = server.stop()
                log(
                    f"  SIGTERM -> exit {run['stop']['exit_code']} in {run['stop']['sigterm_to_exit_s']:.2f} s"
                )
            report["servers"][cfg] = run
            if "error" in run:
                return 1
        if use_wrk and args.overhead_rounds > 0:
            log("instrumentation overhead: stage_timing on / off at c=32 (wrk, JSON body) ...")
            report["instrumentation"] = overhead(
                model,
                args.device,
                wrk_payloads["json"],
                args.wrk_seconds,
                args.overhead_rounds,
                work,
            )
            log(f"  on / off = {fmt(report['instrumentation']['on_over_off'], '.3f')}")
        elif not use_wrk:
            report["skipped"].append(
                "wrk levels and instrumentation overhead: wrk is not installed (or --no-wrk)"
            )

    report["summary"] = summarize(report)
    report["elapsed_s"] = round(time.monotonic() - t_begin, 1)
    print_summary(report)
    out_json = args.out / f"runtime_bench_{tag}.json"
    out_json.write_text(json.dumps(report, indent=2) + "\n")
    log(f"\nwrote {out_json.relative_to(ROOT) if out_json.is_relative_to(ROOT) else out_json}")
    if not args.no_plot:
        try:
            png = args.out / f"runtime_bench_{tag}.png"
            plot(report, png)
            log(f"wrote {png}")
        except ImportError:
            log("no plot: matplotlib is not installed (pip install -r requirements/bench.txt)")
    if report["skipped"]:
        log(
            f"skipped {len(report['skipped'])} level(s) to stay within --budget-s: raise it or lower --duration"
        )
    log(f"total {report['elapsed_s']:.0f} s")
    return 0


def _torch_version() -> str:
    import torch

    return torch.__version__
