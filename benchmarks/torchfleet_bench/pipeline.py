"""`torchfleet-bench pipeline`: the runtime's batch pipeline offline (no HTTP), per bucket, on one
device: how a batch is assembled and run, and what the worker serves when its queue never
empties. torch and the runtime are imported only when it runs.

Per bucket B, a batch of N = B - B/4 rows (rounded, at least 1: the padded case, a batch between
two buckets) arrives as N one-row requests. First the assembly alone, alternated for `--seconds`
(medians, microseconds): `cat_pad` (torch.cat of the rows, a second torch.cat for the padding,
then on CUDA the copy to the device from pageable memory) against `staged` (staging.py: one copy
into the staging buffer, pinned on CUDA, and one non_blocking copy to the device), each waited
for. Then each model cell is the median of runs for `--seconds`:
  eager         the assembly before the pipeline: torch.cat of the rows, a second torch.cat for
                the padding, then the model (the copy to the device from pageable memory)
  staged        staging.py: one copy of the rows into the staging buffer (pinned on CUDA) and
                one non_blocking copy to the device, then the model
  graphs        staged, then the bucket's CUDA graph replayed (graphs.py; null where warm-up
                kept none, with the reason)
and the worker draining a queue of `--batches` x B one-row requests (full batches of B; batcher
and worker bookkeeping included), items/s:
  worker        staged, one batch at a time
  worker_ahead  staged, gathering the next batch while the current one runs (work-ahead)
  worker_graphs work-ahead with the graphs (null without graphs)
On CPU graphs are unavailable (said so) and work-ahead has nothing to overlap: the CPU dry run
checks the command, its figures say nothing about a GPU.

    torchfleet-bench pipeline --device cuda --json benchmarks/results/pipeline_cuda.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchfleet_compat.problems import sentence

from torchfleet_bench import BenchError
from torchfleet_bench.report import host_info

DEFAULT_BUCKETS = "1,8,64,256"


def _rows(bucket: int) -> int:
    return max(1, bucket - bucket // 4)


def _median_s(fn: Callable[[], Any], seconds: float, sync: Callable[[], None]) -> float:
    """Median seconds of one call of `fn` over at least `seconds` (and at least 5 calls)."""
    fn()  # a first call pays one-off costs (allocation, kernel choice)
    sync()
    times: list[float] = []
    end = time.perf_counter() + seconds
    while len(times) < 5 or (time.perf_counter() < end and len(times) < 10_000):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _assembly(
    chunks: list[Any], n: int, bucket: int, stager: Any, cap: int, device: Any, seconds: float
) -> dict[str, float]:
    """Median microseconds of cat+pad(+copy) and of staging the same rows, alternated."""
    import torch
    from torchfleet_runtime.staging import plain

    cuda = device.type == "cuda"

    def cat_pad() -> Any:
        return plain(chunks, bucket, device)

    def staged() -> Any:
        return stager.stage(chunks, bucket, cap).device

    times: dict[str, list[float]] = {"cat_pad": [], "staged": []}
    end = time.perf_counter() + seconds
    while len(times["staged"]) < 20 or (time.perf_counter() < end and len(times["staged"]) < 5000):
        for name, fn in (("cat_pad", cat_pad), ("staged", staged)):
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize(device)
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "cat_pad_us": round(med["cat_pad"] * 1e6, 1),
        "staged_us": round(med["staged"] * 1e6, 1),
        "staged_over_cat_pad": round(med["staged"] / med["cat_pad"], 3),
    }


def _drain(loaded: Any, graphs: Any, bucket: int, batches: int, ahead: bool, sample: Any) -> float:
    """Items/s of one worker draining `batches` x `bucket` one-row requests queued before it
    starts (full batches: the cap is `bucket`)."""
    from torchfleet_runtime.batcher import Batcher
    from torchfleet_runtime.tensors import buckets_up_to, make_batch
    from torchfleet_runtime.worker import Worker

    rows = make_batch(sample, bucket)
    worker = Worker(loaded.predictor, str(loaded.device), graphs=graphs, ahead=ahead)
    b = Batcher([worker], buckets_up_to(bucket), 0.0, max_queue=batches * bucket)
    requests = [b.submit(rows[i : i + 1]) for _ in range(batches) for i in range(bucket)]
    t0 = time.perf_counter()
    b.start()
    for r in requests:
        r.result(600)
    took = time.perf_counter() - t0
    b.close(10)
    return len(requests) / took


def measure(args: argparse.Namespace) -> dict[str, Any]:
    try:
        import torch
        from torchfleet_runtime.config import Config, ConfigError
        from torchfleet_runtime.demo import write_demo_model
        from torchfleet_runtime.graphs import capture
        from torchfleet_runtime.model import ModelError, load
        from torchfleet_runtime.optimize import optimize
        from torchfleet_runtime.staging import Stager, plain
        from torchfleet_runtime.tensors import make_batch
        from torchfleet_runtime.warmup import load_sample, warm_up
    except ImportError as exc:
        raise BenchError(f"pipeline needs torch and torchfleet-runtime installed ({exc})") from None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BenchError(sentence("--device", "cuda", "cpu", why="torch sees no CUDA device"))
    buckets = sorted({int(b) for b in args.buckets.split(",")})
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(write_demo_model(tmp)[0])
        cfg = Config(model=model, device=args.device, precision=args.precision)
        try:
            loaded = load(cfg)
        except (ModelError, ConfigError) as exc:
            raise BenchError(f"--model {model}: the runtime cannot load it ({exc})") from None
        sample = load_sample(None, loaded.metadata)
        loaded = optimize(loaded, sample, cfg.optimize)
        pred = loaded.predictor
        cuda = loaded.device.type == "cuda"

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(loaded.device)

        warm_up(pred, sample, buckets, 3)
        graphs = capture(pred, sample, buckets, "off" if args.no_graphs else "auto")
        stager = Stager(loaded.device if cuda else torch.device("cpu"), 2)
        out: dict[str, Any] = {
            "host": host_info(),
            "device": str(loaded.device)
            + (f" ({torch.cuda.get_device_name(loaded.device)})" if cuda else ""),
            "torch": torch.__version__,
            "model": "demo" if not args.model else Path(args.model).name,
            "input_shape": list(loaded.metadata.input_shape),
            "precision": args.precision,
            "seconds_per_cell": args.seconds,
            "cuda_graphs": graphs.describe(),
            "buckets": {},
        }
        for bucket in buckets:
            n = _rows(bucket)
            chunks = list(make_batch(sample, n).split(1))

            def eager(bucket: int = bucket, chunks: list[Any] = chunks) -> Any:
                return pred(plain(chunks, bucket, None))

            def staged(bucket: int = bucket, chunks: list[Any] = chunks) -> Any:
                s = stager.stage(chunks, bucket, buckets[-1])
                return pred.fetch(pred.launch(s.device))

            def replayed(bucket: int = bucket, chunks: list[Any] = chunks) -> Any:
                s = stager.stage(chunks, bucket, buckets[-1])
                return pred.fetch(graphs.replay(s.device))

            cell: dict[str, Any] = {"rows": n}
            cell["assembly"] = _assembly(
                chunks, n, bucket, stager, buckets[-1], stager.device, args.seconds
            )
            for name, fn in (("eager", eager), ("staged", staged), ("graphs", replayed)):
                if name == "graphs" and not graphs.has(bucket):
                    cell[name] = None
                    continue
                s = _median_s(fn, args.seconds, sync)
                cell[name] = {"ms": round(s * 1000, 4), "items_per_s": round(n / s, 1)}
            for name, ahead, g in (
                ("worker", False, None),
                ("worker_ahead", True, None),
                ("worker_graphs", True, graphs),
            ):
                if g is not None and not g.has(bucket):
                    cell[name] = None
                    continue
                rate = _drain(loaded, g, bucket, args.batches, ahead, sample)
                cell[name] = {"items_per_s": round(rate, 1)}
            out["buckets"][str(bucket)] = cell
        return out


def table(doc: dict[str, Any]) -> list[str]:
    cols = ("eager", "staged", "graphs", "worker", "worker_ahead", "worker_graphs")
    lines = [
        f"{doc['device']}, torch {doc['torch']}, {doc['model']} {doc['input_shape']}, "
        f"{doc['precision']}; items/s per bucket (batch of rows padded to the bucket)",
        "bucket  rows  " + "  ".join(f"{c:>13}" for c in cols),
    ]
    for bucket, cell in doc["buckets"].items():
        vals = [f"{cell[c]['items_per_s']:>13,.0f}" if cell[c] else f"{'-':>13}" for c in cols]
        lines.append(f"{bucket:>6}  {cell['rows']:>4}  " + "  ".join(vals))
    lines.append("assembly alone, median us: bucket  rows    cat+pad     staged  staged/cat+pad")
    for bucket, cell in doc["buckets"].items():
        a = cell["assembly"]
        lines.append(
            f"{'':>27}{bucket:>6}  {cell['rows']:>4}  {a['cat_pad_us']:>9,.1f}"
            f"  {a['staged_us']:>9,.1f}  {a['staged_over_cat_pad']:>6.3f}"
        )
    g = doc["cuda_graphs"]
    lines.append(
        "CUDA graphs: "
        + (f"batch sizes {g['buckets']}" if g["enabled"] else f"unavailable ({g['reason']})")
    )
    for bucket, why in g["per_bucket"].items():
        lines.append(f"  batch {bucket}: {why}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="torchfleet-bench pipeline", description=(__doc__ or "").split("\n\n")[0]
    )
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--model", help="a TorchScript file with its sidecar (default: the demo model)")
    ap.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    ap.add_argument("--buckets", default=DEFAULT_BUCKETS, help="comma-separated batch sizes")
    ap.add_argument("--seconds", type=float, default=0.5, help="per cell (default 0.5)")
    ap.add_argument("--batches", type=int, default=20, help="batches per worker drain")
    ap.add_argument("--no-graphs", action="store_true", help="skip the CUDA graph capture")
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    args = ap.parse_args(argv)
    try:
        doc = measure(args)
    except BenchError as exc:
        print(f"torchfleet-bench pipeline: {exc}", file=sys.stderr)
        return 2
    print("\n".join(table(doc)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0
