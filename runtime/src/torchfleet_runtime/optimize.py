"""Graph optimisation of a loaded TorchScript model, kept only when it is right and faster.

`optimize(loaded, sample, mode)` returns the model to serve and says what it did
(`LoadedModel.optimization`, shown in /v1/model and logged):

- `mode: auto` on a CPU TorchScript model at fp32 runs `torch.jit.optimize_for_inference`
  (freeze: weights become constants, batch-norm folded into the convolutions; then oneDNN
  convolutions with pre-packed weights). The original module is left as it was (freeze works
  on a copy).
- The candidate is checked before it serves, on `COMPARE_BATCH` sample rows (repeated when
  the sample has fewer): its outputs must equal the original's within `RTOL`/`ATOL` (same
  structure, same dtypes, NaN where NaN), and its best of `TIMED_RUNS` must not be slower than
  the original's by more than `SLOWER` (both timed after `SPECIALISE_RUNS` runs, which
  TorchScript's profiling executor spends on specialising to the shape; the two alternate, so
  drift of the machine falls on both). One short timing at start-up cannot separate graphs
  within about 10 % of each other on a shared machine (runtime/README.md, "Optimise"), so only
  a clearly slower candidate is refused. An exception, a mismatch or a slower candidate: the
  original serves, and the reason is recorded.
- Elsewhere (GPU, autocast precisions, eager modules, ONNX, `mode: off`) the model serves as
  loaded: those paths are not measured here, and a GPU model's graph is the GPU's to fuse.

Why not `torch.compile`: torch 2.x deprecates the TorchScript passes in its favour, but it needs
a C++ toolchain on the node and compiles for tens of seconds at start (and after every reload),
and torch 1.12 has no compile at all; these passes take a fraction of a second.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import torch

from .model import LoadedModel, Outputs, Predictor

log = logging.getLogger(__name__)

METHOD = "optimize_for_inference"
RTOL = 1e-3  # batch-norm folding reorders float sums: differences of 1e-7 relative are seen
ATOL = 1e-5  # plus this times the largest magnitude of the output (logits near zero)
COMPARE_BATCH = 4  # batch 2 timed the same pair with twice the spread (runtime/README.md)
SPECIALISE_RUNS = 2
TIMED_RUNS = 2
SLOWER = 0.9  # refuse a candidate measured below this speed-up


def optimize(loaded: LoadedModel, sample: torch.Tensor, mode: str) -> LoadedModel:
    """The model to serve: `loaded` optimised when that is checked right and faster, else as is."""
    why_not = _not_applicable(loaded, mode)
    if why_not:
        loaded.optimization = {"method": None, "reason": why_not}
        return loaded
    batch = sample[torch.arange(COMPARE_BATCH) % sample.shape[0]]  # rows repeated if too few
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():  # torch 2.x: "deprecated, use torch.compile" (see above)
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.optimize_for_inference(loaded.module)
        candidate = Predictor(module, loaded.device, None)
        base_s, cand_s, mismatch = _compare(loaded.predictor, candidate, batch)
    except Exception as exc:  # a graph the passes or the new graph cannot handle: serve as loaded
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        return _kept(loaded, f"{METHOD} failed: {first}")
    took_s = time.perf_counter() - t0
    if mismatch:
        return _kept(loaded, f"{METHOD} changed the outputs: {mismatch}")
    speedup = base_s / cand_s
    if speedup < SLOWER:
        return _kept(loaded, f"{METHOD} was slower ({speedup:.2f}x at batch {COMPARE_BATCH})")
    log.info(
        "model optimised: %s, %.2fx at batch %d, outputs within rtol %g (%.2f s)",
        METHOD,
        speedup,
        COMPARE_BATCH,
        RTOL,
        took_s,
    )
    loaded.predictor = candidate
    loaded.module = module
    loaded.optimization = {
        "method": METHOD,
        "speedup": round(speedup, 2),
        "compared_at_batch": COMPARE_BATCH,
        "seconds": round(took_s, 3),
    }
    return loaded


def _not_applicable(loaded: LoadedModel, mode: str) -> str:
    if mode == "off":
        return "optimize: off"
    if loaded.format != "torchscript":
        return f"a {loaded.format} model (only TorchScript graphs are optimised)"
    if loaded.device.type != "cpu":
        return f"device {loaded.device} (only CPU models are optimised)"
    if loaded.predictor.amp_dtype is not None:
        return "precision with autocast (only fp32 models are optimised)"
    if not hasattr(torch.jit, "optimize_for_inference") or not torch.backends.mkldnn.is_available():
        return f"torch {torch.__version__} has no oneDNN optimize_for_inference"
    return ""


def _kept(loaded: LoadedModel, reason: str) -> LoadedModel:
    log.warning("serving the model as loaded: %s", reason)
    loaded.optimization = {"method": None, "reason": reason}
    return loaded


def _compare(base: Predictor, cand: Predictor, batch: torch.Tensor) -> tuple[float, float, str]:
    """Best seconds of each on `batch` and how their outputs differ ("" when they agree)."""
    best = {"base": float("inf"), "cand": float("inf")}
    outs: dict[str, Outputs] = {}
    for i in range(SPECIALISE_RUNS + TIMED_RUNS):
        for name, pred in (("base", base), ("cand", cand)):
            t0 = time.perf_counter()
            outs[name] = pred(batch)
            if i >= SPECIALISE_RUNS:
                best[name] = min(best[name], time.perf_counter() - t0)
    return best["base"], best["cand"], differs(outs["base"], outs["cand"], "outputs")


def differs(a: Any, b: Any, where: str) -> str:
    """How `b` differs from `a` beyond RTOL/ATOL ("" when they agree): the one rule for a graph
    that must answer as the model does (this module's candidate, graphs.py's replays)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return f"{where}: {_kind(a)} became {_kind(b)}"
        if not a.is_floating_point():
            return "" if torch.equal(a, b) else f"{where}: integer values differ"
        scale = float(a.abs().nan_to_num(0, 0, 0).max()) if a.numel() else 0.0
        if torch.allclose(b, a, rtol=RTOL, atol=ATOL * max(scale, 1.0), equal_nan=True):
            return ""
        worst = float((b - a).abs().nan_to_num(float("inf")).max())
        return f"{where}: differ by up to {worst:.3g} (largest value {scale:.3g})"
    if isinstance(a, (tuple, list)):
        if not isinstance(b, (tuple, list)) or len(a) != len(b):
            return f"{where}: {_kind(a)} became {_kind(b)}"
        pairs = [(f"{where}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b))]
    elif isinstance(a, dict):
        if not isinstance(b, dict) or set(a) != set(b):
            return f"{where}: {_kind(a)} became {_kind(b)}"
        pairs = [(f"{where}[{k!r}]", a[k], b[k]) for k in a]
    else:
        return "" if a == b else f"{where}: {a!r} became {b!r}"
    for at, x, y in pairs:
        found = differs(x, y, at)
        if found:
            return found
    return ""


def _kind(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor {tuple(x.shape)} {x.dtype}"
    if isinstance(x, dict):
        return f"dict with keys {sorted(map(str, x))}"
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__} of {len(x)}"
    return type(x).__name__
