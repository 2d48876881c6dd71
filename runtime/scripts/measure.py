#!/usr/bin/env python3
"""The runtime's headline figures with the demo model, printed as one table.

    python runtime/scripts/measure.py            # CPU (this machine): ~2-3 minutes
    python runtime/scripts/measure.py --gpu      # on a GPU node: GPU tests, then the same figures

Figures: served / offline throughput at concurrency 1, 8, 32, 64 (batching on); batching on /
off (max_batch_size 1) at the same concurrencies; seconds from process start to /readyz 200;
the first request after ready / the steady p50 at concurrency 1. The load generator is
`torchfleet-runtime bench`; servers are real `torchfleet-runtime serve` processes.
Numbers, not asserts: they depend on the machine (and on whatever else it runs).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BIN = Path(sys.executable).with_name("torchfleet-runtime")
REPO = Path(__file__).resolve().parents[2]
CONCURRENCY = "1,8,32,64"


def cli(*args: str) -> list[str]:
    return [str(BIN), *args] if BIN.exists() else [sys.executable, "-m", "torchfleet_runtime.cli", *args]


def serve(model: str, device: str, extra: list[str]) -> tuple[subprocess.Popen, int, float]:
    """Start a server; returns (process, port, seconds from spawn to /readyz 200)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cli("serve", "--model", model, "--port", "0", "--device", device,
                                "--spot-watch", "off", *extra), stderr=subprocess.PIPE, text=True)
    port = None
    for line in proc.stderr:
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit("serve exited before listening")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep the pipe drained
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit("serve exited during start-up")
        time.sleep(0.01)
    return proc, port, time.perf_counter() - t0


def first_request_ms(port: int) -> float:
    body = json.dumps({"inputs": [[[0.1] * 64] * 64] * 3}).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.perf_counter()
    c.request("POST", "/v1/predict", body, {"Content-Type": "application/json"})
    resp = c.getresponse()
    resp.read()
    assert resp.status == 200, resp.status
    return (time.perf_counter() - t0) * 1000


def bench(port: int, out: Path, duration: float, offline: list[str]) -> dict:
    subprocess.run(cli("bench", f"http://127.0.0.1:{port}", "--concurrency", CONCURRENCY, "--duration", str(duration),
                       "--json", str(out), *offline), stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())  # bench exits 1 when a level had no success: still report it


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help="run on cuda, after the GPU tests")
    ap.add_argument("--duration", type=float, default=None, help="seconds per concurrency level")
    ap.add_argument("--cap", type=int, default=None, help="max_batch_size with batching on (default: auto)")
    args = ap.parse_args()
    device = "cuda" if args.gpu else "cpu"
    duration = args.duration or (8.0 if args.gpu else 5.0)
    if args.gpu:
        print("== GPU tests", flush=True)
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", str(REPO / "tests" / "runtime")]).returncode
        if rc != 0:
            print(f"GPU tests failed (exit {rc}); measuring anyway", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="torchfleet-measure-"))
    subprocess.run(cli("demo-model", str(tmp)), check=True, stdout=subprocess.DEVNULL)
    model = str(tmp / "model.pt")
    results = {}
    on_args = ["--max-batch-size", str(args.cap)] if args.cap else []
    for name, extra in (("on", on_args), ("off", ["--max-batch-size", "1"])):
        proc, port, ready_s = serve(model, device, extra)
        try:
            first = first_request_ms(port)
            offline = ["--offline", model, "--device", device] if name == "on" else []
            report = bench(port, tmp / f"bench-{name}.json", duration, offline)
            with urllib_model(port) as info:
                cap = info["max_batch_size"]
        finally:
            proc.terminate()
            rc = proc.wait(60)
        results[name] = dict(ready_s=ready_s, first_ms=first, report=report, cap=cap, exit=rc)

    on, off = results["on"], results["off"]
    best = on["report"]["offline"]["best"]
    print(f"\n== torchfleet-runtime, demo model, {device}, {duration:g} s per level "
          f"(offline best {best['items_per_s']:.1f} items/s at batch {best['batch']}; batching cap {on['cap']})")
    print(f"{'conc':>5} {'served/s':>9} {'÷offline':>9} {'p50 ms':>8} {'p99 ms':>8} {'unbatched/s':>12} {'on÷off':>7} {'errors':>7}")
    for lv_on, lv_off in zip(on["report"]["levels"], off["report"]["levels"]):
        errs = sum(lv_on["errors"].values()) + sum(lv_off["errors"].values())
        ratio = lv_on["items_per_s"] / lv_off["items_per_s"] if lv_off["items_per_s"] else float("nan")
        p50, p99 = (lv_on["latency_ms"][k] or float("nan") for k in ("p50", "p99"))
        print(f"{lv_on['concurrency']:>5} {lv_on['items_per_s']:>9.1f} {lv_on['items_per_s'] / best['items_per_s']:>9.2f} "
              f"{p50:>8.1f} {p99:>8.1f} {lv_off['items_per_s']:>12.1f} {ratio:>7.2f} {errs:>7}")
    steady = on["report"]["levels"][0]["latency_ms"]["p50"] or float("nan")
    print(f"start to ready: {on['ready_s']:.2f} s (batching on, {len(on['report']['model']['warmed_batch_sizes'])} buckets), "
          f"{off['ready_s']:.2f} s (off)")
    print(f"first request after ready: {on['first_ms']:.1f} ms; steady p50 at c=1: {steady:.1f} ms; "
          f"ratio {on['first_ms'] / steady:.2f}")
    print(f"exit codes after SIGTERM: {on['exit']}, {off['exit']}; reports in {tmp}")
    return 0


class urllib_model:
    """GET /v1/model as a context manager (keeps main() readable)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def __enter__(self) -> dict:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("GET", "/v1/model")
        return json.loads(c.getresponse().read())

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
