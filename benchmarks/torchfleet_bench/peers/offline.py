"""The model's own in-process limit: best items/s over batch sizes, on the file the servers load.

Run in a child process with the servers' thread environment (OMP_NUM_THREADS set or not), so
served / offline compares like with like and the harness process never holds torch threads:
    python -m torchfleet_bench.peers.offline MODEL.pt --shape 3,64,64 [--batches 1,2,4,8,16,32] [--seconds 1]
        [--device cuda] [--file-only]
prints one JSON object: {"results": [{batch, items_per_s, batch_ms}], "best": {...}, "threads",
"served_graph": {...}}. `results`/`best` time the file as `torch.jit.load` gives it (what the peers
run); `served_graph` the same rows for the graph torchfleet-runtime serves (`torchfleet_bench.offline.served_graph`:
the runtime's loader and optimiser with their defaults), so torchfleet's
served / offline measures what is lost between the socket and the model it really runs.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def measure(
    model_path: str,
    shape: tuple[int, ...],
    batches: list[int],
    seconds: float,
    device: str = "cpu",
    served: bool = True,
) -> dict:
    """`served`: also the rows of the graph torchfleet serves (on the CPU only)."""
    import torch

    model = torch.jit.load(model_path, map_location=device).eval()
    out = rows_of(model, shape, batches, seconds, device)
    if served:
        out["served_graph"] = served_graph(model_path, shape, batches, seconds)
    return out


def served_graph(
    model_path: str, shape: tuple[int, ...], batches: list[int], seconds: float
) -> dict:
    """The rows for the module torchfleet-runtime serves (its loader, then its optimiser)."""
    from torchfleet_bench.offline import served_graph as runtime_graph

    module, optimization = runtime_graph(model_path, shape, "float32", "cpu", "fp32")
    out = rows_of(module, shape, batches, seconds)
    out["optimization"] = optimization
    return out


def rows_of(
    model: Any, shape: tuple[int, ...], batches: list[int], seconds: float, device: str = "cpu"
) -> dict:
    """Items/s per batch; on a GPU each timed span ends synchronised (the kernels finished)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rows = []
    with torch.inference_mode():
        for b in batches:
            x = torch.randn((b, *shape), generator=gen).to(device)
            # TorchScript's profiling executor specialises on the first calls of a new shape
            t0 = time.perf_counter()
            warm = 0
            while warm < 3 or time.perf_counter() - t0 < seconds / 4:
                model(x)
                warm += 1
            sync()
            passes, t0 = 0, time.perf_counter()
            while passes < 3 or time.perf_counter() - t0 < seconds:
                model(x)
                passes += 1
            sync()
            elapsed = time.perf_counter() - t0
            rows.append(
                {
                    "batch": b,
                    "items_per_s": round(b * passes / elapsed, 2),
                    "batch_ms": round(elapsed / passes * 1000, 3),
                }
            )
    return {
        "results": rows,
        "best": max(rows, key=lambda r: r["items_per_s"]),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--shape", required=True, help="one instance, e.g. 3,64,64")
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--seconds", type=float, default=1.0, help="measured seconds per batch size")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    ap.add_argument(
        "--file-only", action="store_true", help="only the file as loaded, not the served graph"
    )
    a = ap.parse_args()
    shape = tuple(int(d) for d in a.shape.split(","))
    batches = [int(b) for b in a.batches.split(",")]
    print(json.dumps(measure(a.model, shape, batches, a.seconds, a.device, not a.file_only)))


if __name__ == "__main__":
    main()
