"""The offline ceiling: in-process items/s of a TorchScript model at each batch size, best kept,
so served / offline is one number. By default it times the graph torchfleet-runtime serves (the
runtime's own loader and optimiser, `served_graph`): the one place the benchmarks import the
runtime's internals. torch is imported here only, when a measurement runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from torchfleet_bench import BenchError


def load_offline_model(path: str, device: str) -> Any:
    import torch

    try:
        model = torch.jit.load(path, map_location=device)
    except Exception as exc:  # RuntimeError for non-TorchScript files, OSError if missing
        raise BenchError(f"--offline {path}: not a loadable TorchScript file ({exc})") from None
    return model.eval()


def served_graph(
    path: str, shape: Sequence[int], dtype: str, device: str, precision: str
) -> tuple[Any, dict[str, Any]]:
    """The module torchfleet-runtime serves for this file, and what its optimiser did: the
    runtime's own loader and `optimize` (runtime/src/torchfleet_runtime/optimize.py) with its
    defaults, so served / offline compares the server with the graph it really runs."""
    try:
        from torchfleet_runtime.config import Config, ConfigError
        from torchfleet_runtime.model import ModelError, load
        from torchfleet_runtime.optimize import optimize
        from torchfleet_runtime.warmup import load_sample
    except ImportError as exc:
        raise BenchError(
            f"--optimize auto needs the torchfleet-runtime package ({exc}); install it, or give "
            "--optimize off to time the file as loaded"
        ) from None
    cfg = Config(
        model=path, input_shape=tuple(shape), dtype=dtype, device=device, precision=precision
    )
    try:
        loaded = load(cfg)
    except (ModelError, ConfigError) as exc:
        raise BenchError(f"--offline {path}: the runtime cannot load it ({exc})") from None
    loaded = optimize(loaded, load_sample(None, loaded.metadata), cfg.optimize)
    return loaded.module, loaded.optimization


def offline_benchmark(
    model_path: str,
    shape: Sequence[int],
    dtype: str,
    device: str = "cpu",
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    min_seconds: float = 1.0,
    precision: str = "fp32",
    log: Callable[[str], None] = lambda _m: None,
    optimize: str = "auto",
) -> dict[str, Any]:
    """In-process items/s of the model at each batch size; the best is the served ceiling.
    `optimize`: auto times the graph torchfleet-runtime serves (`served_graph`), off the file.

    Per size: 3 warm-up passes (the runtime's rule; on CUDA they also let cudnn.benchmark pick
    kernels), then passes until `min_seconds` and at least 3 passes have run.
    """
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BenchError(f"--device {device}: torch.cuda.is_available() is False")
    if device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True
    optimization: dict[str, Any] = {"method": None, "reason": "--optimize off"}
    if optimize == "auto":
        model, optimization = served_graph(model_path, shape, dtype, device, precision)
    else:
        model = load_offline_model(model_path, device)
    log(f"  graph: {optimization.get('method') or 'as loaded'} ({optimization})")
    inference = getattr(torch, "inference_mode", torch.no_grad)  # inference_mode: torch 1.9+
    amp = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    device_type = "cuda" if device.startswith("cuda") else "cpu"

    def autocast() -> Any:
        if amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=amp)

    def sync() -> None:
        if device_type == "cuda":
            torch.cuda.synchronize()

    rows = []
    tdtype = getattr(torch, dtype)
    for batch in batch_sizes:
        x = torch.rand((batch, *shape), generator=torch.Generator().manual_seed(0)).to(device)
        x = x.to(tdtype) if tdtype.is_floating_point else (x * 10).to(tdtype)
        with inference(), autocast():
            # at least 3 passes (the runtime's rule) and a fifth of the measured time: the
            # TorchScript profiling executor re-specialises for each new shape in early passes
            warm, t0 = 0, time.perf_counter()
            while warm < 3 or time.perf_counter() - t0 < min_seconds / 5:
                model(x)
                warm += 1
            sync()
            passes, t0 = 0, time.perf_counter()
            while True:
                model(x)
                passes += 1
                if passes >= 3:
                    sync()
                    elapsed = time.perf_counter() - t0
                    if elapsed >= min_seconds:
                        break
        row = {
            "batch": batch,
            "items_per_s": round(batch * passes / elapsed, 2),
            "batch_latency_ms": round(elapsed / passes * 1000, 3),
        }
        log(f"  offline batch {batch:>3}: {row['items_per_s']:>9.1f} items/s")
        rows.append(row)
    best = max(rows, key=lambda r: r["items_per_s"])
    return {
        "model": str(model_path),
        "device": device,
        "precision": precision,
        "optimization": optimization,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "results": rows,
        "best": best,
    }
