"""`torchfleet-bench ab`: A/B of runtime variants under wrk, alternated in the same minutes (a
shared machine is noisy).

Each variant is NAME=[SRC][::FLAGS]: SRC a runtime source tree to put first on PYTHONPATH (empty:
the installed runtime), FLAGS extra `serve` flags, and ENV:KEY=VALUE items for its environment.
Rounds alternate the order; per round every variant gets a fresh server, a 2 s wrk warm-up and a
measured wrk run; it prints req/s, p50/p99, the server's CPU per request, the batch cap and the
load average, then the medians and, for two variants, B / A.

    git archive OLD runtime/src | tar -x -C /tmp/old
    torchfleet-bench ab --rounds 3 --seconds 8 --concurrency 32 \\
        old=/tmp/old/runtime/src new=  "passive=::ENV:OMP_WAIT_POLICY=PASSIVE --torch-threads 1"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infra.client import build_payload
from torchfleet_bench.local import cpu_s, free_port, loopback
from torchfleet_bench.runtime import _wrk_ms as wrk_ms

LUA = """
local f = io.open(os.getenv("AB_BODY"), "rb")
wrk.body = f:read("*all")
f:close()
wrk.method = "POST"
for k, v in string.gmatch(os.getenv("AB_HEADERS"), "([^=;]+)=([^;]*)") do wrk.headers[k] = v end
"""


def wrk(port: int, conc: int, seconds: int, env: dict[str, str], lua: Path) -> str:
    return subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{conc}",
            f"-d{seconds}s",
            "--latency",
            "--timeout",
            "10s",
            "-s",
            str(lua),
            f"http://127.0.0.1:{port}/v1/predict",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    ).stdout


def run_variant(
    spec: str, model: Path, conc: int, seconds: int, env_wrk: dict[str, str], lua: Path
) -> dict:
    src, _, extra = spec.partition("::")
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    flags = []
    for item in extra.split():
        if item.startswith("ENV:"):
            k, v = item[4:].split("=", 1)
            env[k] = v
        else:
            flags.append(item)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from torchfleet_runtime.cli import main; sys.exit(main())",
            "serve",
            "--model",
            str(model),
            "--port",
            str(port),
            "--spot-watch",
            "off",
            "--log-level",
            "warning",
            *flags,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{spec}: serve exited with {proc.returncode}")
            if loopback(port, "GET", "/readyz", timeout=1)[0] == 200:
                break
            if time.monotonic() - t0 > 300:
                raise RuntimeError(f"{spec}: not ready after 300 s")
            time.sleep(0.02)
        ready = time.monotonic() - t0
        info = json.loads(loopback(port, "GET", "/v1/model", timeout=30)[1])
        while (info.get("shadow") or {}).get("state") == "loading":  # measure it serving
            if time.monotonic() - t0 > 300:
                raise RuntimeError(f"{spec}: the shadow candidate still loads after 300 s")
            time.sleep(0.2)
            info = json.loads(loopback(port, "GET", "/v1/model", timeout=30)[1])
        wrk(port, conc, 2, env_wrk, lua)
        load = os.getloadavg()[0]
        c0 = cpu_s(proc.pid)
        out = wrk(port, conc, seconds, env_wrk, lua)
        cpu = cpu_s(proc.pid) - c0
        shadow = json.loads(loopback(port, "GET", "/v1/model", timeout=30)[1]).get("shadow")
    finally:
        proc.terminate()
        proc.wait(60)
    n = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50": lat.get("50"),
        "p99": lat.get("99"),
        "cpu_ms_per_req": round(cpu / max(n, 1) * 1000, 2),
        "cap": info.get("max_batch_size"),
        "ready_s": round(ready, 2),
        "load1": round(load, 1),
        # a shadow candidate's share of the run (runtime/README.md, Shadow testing)
        **({"shadow": shadow["requests"]} if shadow else {}),
    }


def wrk_inputs(work: Path, model: Path | None, binary: bool) -> tuple[Path, dict[str, str], Path]:
    """(model, wrk's environment, its Lua script) in `work`: the demo model unless `model`
    is given, one request body of it (JSON, or raw float32 with `binary`)."""
    if model is None:
        from torchfleet_runtime.demo import write_demo_model

        model, _ = write_demo_model(work / "demo")
    meta = json.loads(model.with_suffix(".json").read_text())
    body, headers = build_payload(
        meta["input_shape"], meta.get("dtype", "float32"), 1, binary, decimals=4
    )
    (work / "body").write_bytes(body)
    lua = work / "bench.lua"
    lua.write_text(LUA)
    env = {
        **os.environ,
        "AB_BODY": str(work / "body"),
        "AB_HEADERS": ";".join(f"{k}={v}" for k, v in headers.items()),
    }
    return model, env, lua


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="torchfleet-bench ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", metavar="NAME=[SRC][::FLAGS]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--binary", action="store_true", help="raw float32 bodies instead of JSON")
    ap.add_argument(
        "--model", type=Path, help="TorchScript file with its sidecar (default: the demo model)"
    )
    args = ap.parse_args(argv)
    variants = [v.split("=", 1) for v in args.variants]
    with tempfile.TemporaryDirectory(prefix="torchfleet-ab-") as tmp:
        model, env_wrk, lua = wrk_inputs(Path(tmp), args.model, args.binary)
        results: dict[str, list[float]] = {name: [] for name, _ in variants}
        lat: dict[str, list[tuple[float | None, float | None]]] = {name: [] for name, _ in variants}
        for r in range(args.rounds):
            for name, spec in variants if r % 2 == 0 else variants[::-1]:
                res = run_variant(spec, model, args.concurrency, args.seconds, env_wrk, lua)
                results[name].append(res["rps"])
                lat[name].append((wrk_ms(res["p50"] or ""), wrk_ms(res["p99"] or "")))
                print(
                    f"round {r + 1} {name:<12} " + " ".join(f"{k} {v}" for k, v in res.items()),
                    flush=True,
                )
    for name, rps in results.items():
        p50 = statistics.median(x[0] or math.nan for x in lat[name])
        p99 = statistics.median(x[1] or math.nan for x in lat[name])
        print(
            f"{name:<12} median {statistics.median(rps):.1f} req/s, p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms over {len(rps)} rounds"
        )
    if len(variants) == 2:
        (a, _), (b, _) = variants
        print(f"{b} / {a} = {statistics.median(results[b]) / statistics.median(results[a]):.2f}")
    return 0
