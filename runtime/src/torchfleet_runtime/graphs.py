"""CUDA graphs per warmed bucket, kept only where a replay answers as the eager run does and is
faster (`cuda_graphs: auto`).

Contract. `capture(predictor, sample, buckets, mode)` runs at warm-up on the replica's thread,
after every bucket is warm, and returns a `Graphs` (empty with the reason when off). Readiness
still means every bucket warm: a bucket without a graph runs eagerly.
- Where: a CUDA replica of a torch model (not ONNX) with `cuda_graphs: auto`, on a torch whose
  `torch.cuda.graph` captures in thread-local mode (compat.CUDA_GRAPHS_WHY_NOT): in the default
  global mode another thread's CUDA calls during a capture (another replica warming, the old
  model serving during a reload) would fail. Elsewhere: off, with the reason.
- How (PyTorch's CUDA-graph recipe): per bucket up to `MAX_BUCKET`, largest first, a static
  input on the device; `WARMUP_RUNS` eager runs on a side stream; the capture, with autocast's
  cast cache off; every graph shares the first one's memory pool (one replay at a time per
  replica, and each replay's outputs are copied to the host before the next replay may
  overwrite them).
- Kept only if right and faster: on the bucket's sample rows the replay's outputs must equal the
  eager run's within optimize.py's tolerance (`optimize.differs`), and its best of `TIMED_RUNS`
  (both synchronised, alternating) must beat the eager run's. A capture that fails (the model
  syncs with the CPU, e.g. data-dependent control flow, or allocates in a way a graph cannot
  hold) turns graphs off for the replica with the reason; an OOM while capturing, a mismatch or
  a slower replay turns off that bucket. The log and /v1/model (`pipeline.cuda_graphs`) say what
  is on and why not.
- Serving (worker.py): `replay(batch)` copies the staged device batch into the bucket's static
  input, replays, and returns the static outputs, which the worker copies to the host
  (`Predictor.fetch`) before it launches another batch. After the batcher lowers the cap (a CUDA
  OOM) the worker calls `drop_above(cap)`: graphs of buckets above it are freed, never replayed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import compat
from .model import Predictor
from .optimize import differs
from .tensors import Outputs, make_batch

log = logging.getLogger(__name__)

WARMUP_RUNS = 3  # side-stream runs before a capture (lazy initialisation, cuDNN/cuBLAS choice)
TIMED_RUNS = 5  # per bucket, eager and replay alternating; the best of each is compared
# Graphs remove per-kernel launch cost, which matters beside short runs (small batches); a large
# bucket's graph would mostly hold a second copy of its activations (vLLM's default capture sizes
# stop at 512 for the same reason). Larger buckets run eagerly.
MAX_BUCKET = 512


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    static_in: torch.Tensor
    static_out: Outputs


@dataclass
class Graphs:
    """One replica's captured graphs by bucket, and why each bucket has one or not."""

    reason: str = ""  # why graphs are off for the whole replica ("" when captured)
    per_bucket: dict[int, str] = field(default_factory=dict)  # bucket -> "on: 1.80x" or why not
    _graphs: dict[int, _Graph] = field(default_factory=dict)
    seconds: float = 0.0  # what capturing and checking took

    @property
    def buckets(self) -> list[int]:
        return sorted(self._graphs)

    def has(self, bucket: int) -> bool:
        return bucket in self._graphs

    def replay(self, batch: torch.Tensor) -> Outputs:
        """The bucket's graph run on `batch` (on the device, exactly a bucket's rows): its static
        outputs, valid until the next replay of any graph of this replica."""
        return _replay(self._graphs[int(batch.shape[0])], batch)

    def drop_above(self, cap: int) -> None:
        for b in [b for b in self._graphs if b > cap]:
            del self._graphs[b]
            self.per_bucket[b] = f"off: dropped, the batch cap was lowered to {cap}"
            log.warning("CUDA graph of batch %d dropped: the batch cap is now %d", b, cap)

    def describe(self) -> dict[str, Any]:
        return {
            "enabled": bool(self._graphs),
            "buckets": self.buckets,
            "reason": self.reason,
            "per_bucket": {str(b): why for b, why in sorted(self.per_bucket.items())},
            "seconds": round(self.seconds, 3),
        }


def why_not(predictor: Predictor, mode: str) -> str:
    """Why `predictor` gets no graphs ("" when it may)."""
    if mode == "off":
        return "cuda_graphs: off"
    if predictor.device.type != "cuda":
        return f"device {predictor.device} (CUDA graphs need a CUDA replica)"
    if not predictor.uses_torch:
        return "an ONNX model (its session runs the batch)"
    return compat.CUDA_GRAPHS_WHY_NOT


def capture(predictor: Predictor, sample: torch.Tensor, buckets: list[int], mode: str) -> Graphs:
    """Capture, check and time a graph per bucket (module doc); never raises for a model that
    cannot be captured, only for a device that no longer works."""
    reason = why_not(predictor, mode)
    if reason:
        return Graphs(reason)
    dev = predictor.device
    out = Graphs()
    t0 = time.perf_counter()
    pool = None
    for b in sorted(buckets, reverse=True):
        if b > MAX_BUCKET:
            out.per_bucket[b] = f"off: above batch {MAX_BUCKET} (its run is long beside a launch)"
            continue
        batch = make_batch(sample, b).to(dev)
        try:
            g = _capture_one(predictor, batch, pool)
        except Exception as exc:  # the model cannot be captured: eager for every bucket
            torch.cuda.synchronize(dev)  # a device that is gone raises here: the replica fails
            root = _root(exc)
            if compat.is_oom(root):  # this bucket's pool does not fit beside the model: smaller may
                compat.cuda_empty_cache()
                out.per_bucket[b] = "off: out of memory while capturing it"
                continue
            first = (str(root).strip().splitlines() or [""])[0][:300]
            out = Graphs(f"capture failed at batch {b}: {type(root).__name__}: {first}")
            break
        pool = g.graph.pool()
        eager_s, replay_s, mismatch = _compare(predictor, g, batch)
        if mismatch:
            out.per_bucket[b] = f"off: the replay changed the outputs ({mismatch})"
            continue
        speedup = eager_s / replay_s
        if speedup <= 1.0:
            out.per_bucket[b] = f"off: the replay was not faster ({speedup:.2f}x)"
            continue
        out._graphs[b] = g
        out.per_bucket[b] = f"on: {speedup:.2f}x"
    if not out.reason and not out.buckets:
        out.reason = "no bucket's replay was both right and faster"
    out.seconds = time.perf_counter() - t0
    log.log(
        logging.WARNING if out.reason.startswith("capture failed") else logging.INFO,
        "CUDA graphs on %s: %s (%.2f s)",
        dev,
        out.reason or f"batch sizes {out.buckets}",
        out.seconds,
        extra={"fields": {"cuda_graphs": out.describe()}},
    )
    return out


def _root(exc: BaseException) -> BaseException:
    """The first error of a failed capture: the model's, which the capture's end (raising its own
    "capture invalidated" error on the way out) hides as its context."""
    seen = {id(exc)}
    while exc.__context__ is not None and id(exc.__context__) not in seen:
        exc = exc.__context__
        seen.add(id(exc))
    return exc


def _capture_one(predictor: Predictor, batch: torch.Tensor, pool: Any) -> _Graph:
    dev = predictor.device
    static_in = batch.clone()
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_RUNS):
            predictor.launch(static_in)
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, **compat.CUDA_GRAPH_CAPTURE_ARGS):
        static_out = predictor.launch(static_in, capturing=True)
    torch.cuda.synchronize(dev)
    return _Graph(graph, static_in, static_out)


def _compare(predictor: Predictor, g: _Graph, batch: torch.Tensor) -> tuple[float, float, str]:
    """Best seconds of the eager run and the replay on `batch`, and how their outputs differ."""
    dev = predictor.device
    best = {"eager": float("inf"), "replay": float("inf")}
    outs: dict[str, Outputs] = {}
    for _ in range(TIMED_RUNS):
        for name in ("eager", "replay"):
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            launched = predictor.launch(batch) if name == "eager" else _replay(g, batch)
            outs[name] = predictor.fetch(launched)  # waits for the device
            best[name] = min(best[name], time.perf_counter() - t0)
    return best["eager"], best["replay"], differs(outs["eager"], outs["replay"], "outputs")


def _replay(g: _Graph, batch: torch.Tensor) -> Outputs:
    g.static_in.copy_(batch)
    g.graph.replay()
    return g.static_out
