"""`torchfleet-bench gpu`: the GPU check's one table (scripts/gpu_check.sh runs it on a lent GPU
machine): every variant a real `torchfleet-runtime serve` on loopback, under the same closed
loop (`levels.py`, binary bodies, `--concurrency` requests in flight, `--seconds` each).

Variants, on the devices of `--device`:
  one          one replica on the first device, fp32, the runtime's own batch cap
  all          one replica per device (`--devices all`: every visible GPU; on CPU every usable
               CPU): scaling efficiency = all / (N x one), the target being >= 0.9
  fp16         `one` at fp16 (autocast; CUDA only)
  no-batching  `one` with max_batch_size 1: batching on / off = one / no-batching
and, from `one`'s /v1/model and /metrics, the memory sizing: the batch cap and how it was chosen,
the memory_fraction it was sized to, and what the caching allocator reserved under the load.
On CPU the same code runs over CPU "devices" (how tests/bench/test_gpu_table.py checks it);
its figures there say nothing about a GPU. Results: benchmarks/results/gpu_check_<device>.json.

    torchfleet-bench gpu --device cuda --seconds 10 --concurrency 64
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torchfleet_compat.problems import sentence

from infra.client import Target, build_payload
from torchfleet_bench.levels import run_level
from torchfleet_bench.local import loopback
from torchfleet_bench.replicas import Servers
from torchfleet_bench.report import host_info

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = ("one", "all", "fp16", "no-batching")


def devices(device: str) -> tuple[str, int]:
    """(`--devices` of one replica: GPU 0 or the first usable CPU, how many devices `all` has)."""
    if device == "cuda":
        import torch

        n = torch.cuda.device_count()
        if n == 0:
            raise SystemExit("torchfleet-bench gpu: --device cuda but torch sees no CUDA device")
        return "0", n
    cpus = sorted(os.sched_getaffinity(0))
    return str(cpus[0]), len(cpus)


def flags(variant: str, device: str) -> list[str] | None:
    """The serve flags of a variant, or None where it does not apply on this device."""
    one, _ = devices(device)
    base = ["--device", device]
    return {
        "one": [*base, "--devices", one],
        "all": [*base, "--devices", "all"],
        "fp16": [*base, "--devices", one, "--precision", "fp16"] if device == "cuda" else None,
        "no-batching": [*base, "--devices", one, "--max-batch-size", "1"],
    }[variant]


def memory(port: int) -> dict[str, Any]:
    """The sizing of the serving replicas and what their allocators reserved (CUDA only)."""
    status, body = loopback(port, "GET", "/v1/model")
    card = json.loads(body) if status == 200 else {}
    out: dict[str, Any] = {
        "max_batch_size": card.get("max_batch_size"),
        "batch_cap_method": card.get("batch_cap_method"),
        "replicas": len(card.get("replicas", [])),
    }
    shares = [
        r["memory"]["reserved_share"]
        for r in card.get("replicas", [])
        if isinstance(r.get("memory"), dict) and "reserved_share" in r["memory"]
    ]
    if shares:
        out["reserved_share_max"] = max(shares)
    _, text = loopback(port, "GET", "/metrics")
    for line in text.decode().splitlines():
        if line.startswith("torchfleet_memory_fraction{"):
            out["memory_fraction"] = float(line.rsplit(" ", 1)[1])
    return out


def measure(
    model: Path, serve_flags: list[str], concurrency: int, seconds: float, work: Path
) -> dict[str, Any]:
    meta = json.loads(model.with_suffix(".json").read_text())
    body, headers = build_payload(meta["input_shape"], meta.get("dtype", "float32"), 1, True)
    servers = Servers(model, [(set(os.sched_getaffinity(0)), serve_flags)], work)
    try:
        ready_s = servers.wait_ready()
        target = Target("http", "127.0.0.1", servers.port, "")
        run_level(target, body, headers, concurrency, 1, duration_s=min(2.0, seconds))  # warm
        level = run_level(target, body, headers, concurrency, 1, duration_s=seconds)
        return {
            "ready_s": round(ready_s, 2),
            "rps": level.throughput_rps,
            "p50_ms": level.latency_ms.get("p50"),
            "p99_ms": level.latency_ms.get("p99"),
            "errors": level.errors,
            **memory(servers.port),
        }
    finally:
        servers.stop()


def _cell(r: dict[str, Any], key: str, fmt: str = "{}") -> str:
    return "-" if r.get(key) is None else fmt.format(r[key])


def table(results: dict[str, dict[str, Any]], n: int) -> tuple[list[str], dict[str, float]]:
    """The printed table and the ratios it ends with."""
    rows = [
        f"{'variant':<12} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'replicas':>8} "
        f"{'batch cap':>9} {'sizing':>10} {'fraction':>8} {'reserved':>8}"
    ]
    for name, r in results.items():
        if "skipped" in r:
            rows.append(f"{name:<12} skipped: {r['skipped']}")
            continue
        rows.append(
            f"{name:<12} {r['rps']:>9.1f} {_cell(r, 'p50_ms', '{:.1f}'):>8} "
            f"{_cell(r, 'p99_ms', '{:.1f}'):>8} {r['replicas']:>8} "
            f"{_cell(r, 'max_batch_size'):>9} {_cell(r, 'batch_cap_method'):>10} "
            f"{_cell(r, 'memory_fraction', '{:.2f}'):>8} "
            f"{_cell(r, 'reserved_share_max', '{:.0%}'):>8}"
        )
    ratios: dict[str, float] = {}

    def ratio(key: str, top: str, bottom: str, times: int = 1) -> None:
        a, b = results.get(top, {}), results.get(bottom, {})
        if a.get("rps") and b.get("rps"):
            ratios[key] = round(a["rps"] / (times * b["rps"]), 3)

    ratio(f"scaling efficiency all / ({n} x one)", "all", "one", n)
    ratio("fp16 / fp32", "fp16", "one")
    ratio("batching on / off", "one", "no-batching")
    rows += [f"{k}: {v:.2f}" for k, v in ratios.items()]
    return rows, ratios


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="torchfleet-bench gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per variant")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--model", type=Path, help="TorchScript file with its sidecar (default: demo)")
    ap.add_argument("--out", type=Path, default=None, help="default: results/gpu_check_<device>")
    args = ap.parse_args(argv)
    chosen = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        ap.error(sentence("--variants", ",".join(unknown), ", ".join(VARIANTS)))
    _, n = devices(args.device)
    results: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchfleet-gpu-") as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            from torchfleet_runtime.demo import write_demo_model

            model, _ = write_demo_model(work / "demo")
        for name in chosen:
            serve = flags(name, args.device)
            if serve is None:
                results[name] = {"skipped": f"not on {args.device}"}
                continue
            print(f"[gpu] {name}: serve {' '.join(serve)}", flush=True)
            results[name] = measure(model, serve, args.concurrency, args.seconds, work)
    rows, ratios = table(results, n)
    print(
        f"\n{args.device}, {n} device(s), c={args.concurrency}, {args.seconds:g} s per variant, "
        f"binary bodies ({time.monotonic() - started:.0f} s in all)"
    )
    print("\n".join(rows))
    out = args.out or RESULTS / f"gpu_check_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "host": host_info(),
        "device": args.device,
        "devices": n,
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "results": results,
        "ratios": ratios,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
