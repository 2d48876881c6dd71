"""Sizing the batch cap and warming every batch size the batcher can produce.

Users' complaint with other servers: warm-up at batch 1 only, so the first real batch of 8 pays
for cuDNN autotuning and allocator growth. Here the batcher only ever runs bucket sizes (powers
of two up to the cap, plus the cap itself), and every bucket is run `warmup_iterations` (>= 3)
times before /readyz turns 200 (runs made while sizing the cap count: they are the same shapes).

The cap is measured, not computed: on CUDA the largest bucket whose peak allocated memory stays
within `memory_fraction` of the device; on CPU the largest bucket whose run fits
`latency_budget_ms` at 75 % or more of the best bare throughput (`choose_cpu_cap`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import compat
from .codec import decode_npy
from .model import Metadata, ModelError, Predictor
from .tensors import DTYPE_NAMES, buckets_up_to, make_batch

log = logging.getLogger(__name__)

AUTO_CEILING_CPU = 256
AUTO_CEILING_CUDA = 1024
# Runs of a CPU bucket before it is timed: a new shape's first run pays one-off costs, and the
# model's very first two (TorchScript's profiling executor profiles, then compiles the optimised
# graph). Then up to TIMED_RUNS, the best one kept. Every bucket up to the cap gets
# warmup_iterations (default 3) runs in all and these count towards them, so fewer runs here is
# a shorter start.
FIRST_UNTIMED_RUNS = 2
UNTIMED_RUNS = 1
TIMED_RUNS = 3
# Sizing stops timing a bucket once its verdict is clear: after two timed runs within
# STABLE_SPREAD of each other (they agree on what the hardware does), or, past the
# first bucket, when its untimed run and its first timed run both take CLEARLY_OVER times the
# latency budget (it would need two disturbed runs and a quiet third to fit). The bucket past
# the cap is the longest one sized, so it was a large share of start -> ready (measured in
# benchmarks/peers/README.md, "Start-up").
STABLE_SPREAD = 0.05
CLEARLY_OVER = 1.5


def load_sample(path: str | None, metadata: Metadata) -> torch.Tensor:
    """Sample rows shaped (k, *input_shape): from a user's file, else seeded random data."""
    shape = metadata.input_shape
    dtype = metadata.torch_dtype
    if path is None:
        gen = torch.Generator().manual_seed(0)
        if dtype.is_floating_point:
            return torch.randn((1, *shape), generator=gen).to(dtype)
        return torch.zeros((1, *shape), dtype=dtype)  # ids or masks: 0 is valid for any vocabulary
    p = Path(path)
    try:
        t = (
            decode_npy(p.read_bytes())
            if p.suffix == ".npy"
            else torch.load(str(p), map_location="cpu")
        )
    except OSError as exc:
        raise ModelError(
            f"config key 'sample_input': cannot read {path!r} ({exc.strerror})"
        ) from None
    except Exception as exc:  # RequestError from the .npy parser, or torch.load's own errors
        raise ModelError(
            f"config key 'sample_input': {path!r} is not a .npy or torch tensor file ({exc})"
        ) from None
    if not isinstance(t, torch.Tensor):
        raise ModelError(
            f"config key 'sample_input': {path!r} holds {type(t).__name__}, not a tensor"
        )
    if tuple(t.shape) == shape:
        t = t.unsqueeze(0)
    if tuple(t.shape[1:]) != shape or t.shape[0] == 0:
        raise ModelError(
            f"config key 'sample_input': shape {list(t.shape)} is not {list(shape)} or [N,{','.join(map(str, shape))}]"
        )
    if t.dtype != dtype:
        raise ModelError(
            f"config key 'sample_input': dtype {DTYPE_NAMES.get(t.dtype, t.dtype)} is not the model's {metadata.dtype}"
        )
    return t


@dataclass
class SizingReport:
    cap: int
    method: str  # "configured", "memory" or "latency"
    measurements: dict[int, float] = field(default_factory=dict)  # bucket -> peak bytes or seconds
    runs: dict[int, int] = field(default_factory=dict)  # bucket -> forward passes made while sizing


def size_cap(
    predictor: Predictor,
    sample: torch.Tensor,
    configured: int | None,
    memory_fraction: float,
    latency_budget_s: float,
    held_bytes: int = 0,
) -> SizingReport:
    """`held_bytes`: CUDA memory another model of this process holds now (a reload sizes the new
    model beside the old one, which goes away after the swap): not counted against the share."""
    if configured is not None:
        return SizingReport(configured, "configured")
    if predictor.device.type == "cuda":
        return _size_by_memory(predictor, sample, memory_fraction, held_bytes)
    return _size_by_latency(predictor, sample, latency_budget_s)


def _device_total_memory(device: torch.device) -> int:
    mem_get_info = getattr(torch.cuda, "mem_get_info", None)  # 1.10+
    if mem_get_info is not None:
        return int(mem_get_info(device)[1])
    return int(torch.cuda.get_device_properties(device).total_memory)


def _size_by_memory(
    predictor: Predictor, sample: torch.Tensor, fraction: float, held_bytes: int
) -> SizingReport:
    device = predictor.device
    limit = fraction * _device_total_memory(device)
    report = SizingReport(1, "memory")
    for b in buckets_up_to(AUTO_CEILING_CUDA):
        torch.cuda.reset_peak_memory_stats(device)
        try:
            predictor(make_batch(sample, b))
            torch.cuda.synchronize(device)
        except RuntimeError as exc:
            if not compat.is_oom(exc):
                raise
            compat.cuda_empty_cache()
            break
        peak = torch.cuda.max_memory_allocated(device) - held_bytes
        report.measurements[b] = float(peak)
        report.runs[b] = 1
        if peak > limit:
            break
        report.cap = b
    compat.cuda_empty_cache()
    log.info(
        "batch cap %d: largest bucket within %.0f%% of GPU memory (peaks %s)",
        report.cap,
        fraction * 100,
        {k: f"{v / 2**20:.0f}MiB" for k, v in report.measurements.items()},
    )
    return report


# A bucket's bare throughput (items/s of the model alone) may fall this far below the best one
# and still be chosen: serving adds a cost per batch (queue hand-off, stacking the inputs, one
# answer per request) that the bare model does not pay, so served throughput keeps growing past
# the bare model's peak. The floor still refuses a bucket that costs much more per item.
# Measured in benchmarks/peers/README.md ("The CPU cap rule").
CPU_CAP_MIN_RATE = 0.75


def choose_cpu_cap(seconds_per_bucket: dict[int, float], budget_s: float) -> int:
    """The largest bucket that fits the latency budget and reaches CPU_CAP_MIN_RATE of the best
    bare throughput among those that fit. A dip at one bucket (a neighbour took the core for a
    moment) does not stop the search: a larger cap costs nothing at low load, since the batcher
    only forms big batches when requests are queued, and stopping early on CPU noise turns
    batching off."""
    fits = _rates_within(seconds_per_bucket, budget_s)
    if not fits:
        return 1
    floor = CPU_CAP_MIN_RATE * max(fits.values())
    return max(b for b, rate in fits.items() if rate >= floor)


def _rates_within(seconds_per_bucket: dict[int, float], budget_s: float) -> dict[int, float]:
    """Items/s of each bucket that fits the latency budget."""
    return {b: b / s for b, s in seconds_per_bucket.items() if s <= budget_s}


# A bucket that misses the budget or the rate floor by less than this factor is timed once more
# (the best of all its runs kept): a neighbour that took the core during those runs moved the
# demo model's cap between 8 and 16 from one start to the next, and its c=32 rate with it
# (benchmarks/peers/README.md, "All four, with the thread tuner"). A clear miss costs no extra
# run.
CPU_CAP_RETRY_MARGIN = 1.3


def _near_miss(b: int, seconds: float, smaller: dict[int, float], budget_s: float) -> bool:
    """Whether bucket `b`, measured at `seconds`, fails the cap rule by a margin noise explains."""
    if seconds > budget_s:
        return seconds <= budget_s * CPU_CAP_RETRY_MARGIN
    floor = CPU_CAP_MIN_RATE * max(_rates_within(smaller, budget_s).values(), default=0.0)
    return floor / CPU_CAP_RETRY_MARGIN <= b / seconds < floor


def _run(predictor: Predictor, batch: torch.Tensor) -> float:
    t0 = time.perf_counter()
    predictor(batch)
    return time.perf_counter() - t0


def _timed_runs(predictor: Predictor, batch: torch.Tensor, over_s: float | None) -> list[float]:
    """Up to TIMED_RUNS timed runs of one bucket, fewer once the verdict is clear: the first
    over `over_s` (given when the untimed run was too), or two within STABLE_SPREAD."""
    runs = [_run(predictor, batch)]
    if over_s is not None and runs[0] > over_s:
        return runs
    while len(runs) < TIMED_RUNS:
        runs.append(_run(predictor, batch))
        fastest, second = sorted(runs)[:2]
        if second <= fastest * (1 + STABLE_SPREAD):
            break
    return runs


def _size_by_latency(predictor: Predictor, sample: torch.Tensor, budget_s: float) -> SizingReport:
    report = SizingReport(1, "latency")
    over_s = CLEARLY_OVER * budget_s
    for i, b in enumerate(buckets_up_to(AUTO_CEILING_CPU)):
        batch = make_batch(sample, b)
        untimed = FIRST_UNTIMED_RUNS if i == 0 else UNTIMED_RUNS
        untimed_s = [_run(predictor, batch) for _ in range(untimed)][-1]
        # past the first bucket, an untimed run clearly over the budget lets one timed run decide
        runs = _timed_runs(predictor, batch, over_s if i > 0 and untimed_s > over_s else None)
        seconds = min(runs)  # the best run: what the hardware can do, least disturbed by neighbours
        if _near_miss(b, seconds, report.measurements, budget_s):
            runs += _timed_runs(predictor, batch, None)  # a disturbed run must not set the cap
            seconds = min(runs)
        report.measurements[b] = seconds
        report.runs[b] = untimed + len(runs)
        if seconds > budget_s:
            break  # larger buckets only take longer
    report.cap = choose_cpu_cap(report.measurements, budget_s)
    log.info(
        "batch cap %d: largest bucket within %.0f ms at >= %.0f%% of the best throughput (%s)",
        report.cap,
        budget_s * 1000,
        CPU_CAP_MIN_RATE * 100,
        {k: f"{v * 1000:.1f}ms" for k, v in report.measurements.items()},
    )
    return report


def warm_up(
    predictor: Predictor,
    sample: torch.Tensor,
    buckets: list[int],
    iterations: int,
    done: dict[int, int] | None = None,
    seconds: dict[int, float] | None = None,
) -> list[int]:
    """Run every bucket `iterations` times, less the runs `done` already made of it (sizing);
    returns the buckets that ran (OOM truncates the list). `seconds`, when given, gets each
    bucket's fastest run (kept if a sizing run was faster): the batcher's cost of a bucket."""
    cuda = predictor.device.type == "cuda"
    if cuda:
        # Fixed shapes per bucket: let cuDNN pick the fastest kernels once, during warm-up.
        torch.backends.cudnn.benchmark = True
    warmed: list[int] = []
    for b in buckets:
        batch = make_batch(sample, b)
        try:
            for _ in range(max(0, iterations - (done or {}).get(b, 0))):
                t0 = time.perf_counter()
                predictor(batch)
                if seconds is not None:
                    if cuda:
                        torch.cuda.synchronize(predictor.device)
                    took = time.perf_counter() - t0
                    seconds[b] = min(seconds.get(b, took), took)
        except RuntimeError as exc:
            if not compat.is_oom(exc) or not warmed:
                raise
            compat.cuda_empty_cache()
            log.warning("out of memory warming batch %d: the cap is lowered to %d", b, warmed[-1])
            break
        warmed.append(b)
    if predictor.device.type == "cuda":
        torch.cuda.synchronize(predictor.device)
    return warmed
