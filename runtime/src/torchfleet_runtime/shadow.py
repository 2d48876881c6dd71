"""Shadow testing: a candidate model beside the serving one, run on a sampled share of live
requests off the answer's path, its outputs compared with the answers the clients got.

Contract.
- `Shadow.start(...)` builds the candidate (config key `shadow_model`, or a module given by an
  embedding) the way a reload builds a model (model.load, optimize, warm-up over the serving
  model's buckets, a Batcher) in its own thread, `torchfleet-shadow`, which then serves it. That
  thread runs torch with one intra-op thread (OpenMP keeps the count per thread) at the lowest
  CPU priority (nice 19), so the serving model keeps its CPUs. Its input shape and dtype must be
  the serving model's: a candidate that cannot take the live requests fails to load, is logged
  and counted, and the serving model never notices.
- The live path touches it twice, never waiting and never raising: `sampled()` when a request
  is admitted (one random draw against `shadow_sample`: the request's input tensor is kept only
  then) and `offer(...)` once its answer is computed. `offer` drops the job, counted by reason,
  when the candidate is not serving (`not_ready`), when the serving model's queue holds a full
  batch or more (`load`: under load the shadow goes first) or when the candidate's queue is full
  (`busy`: `shadow_max_queue` instances; a slow or hung candidate only ever fills its own queue).
- Compared in the candidate's thread (`compare`): the largest absolute difference of all output
  values, and per instance whether the argmax of the first output agrees and the overlap of the
  two top-k sets (`shadow_top_k`); the model time of each side for the same requests. A
  candidate that raises is counted (`error`), a different output structure as `mismatch`.
- `summary()` is the `shadow` object of GET /v1/model; the metrics are `torchfleet_shadow_*`
  labelled with the candidate's `model_version` (metrics.py).
"""

from __future__ import annotations

import collections
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from .batcher import Batcher, QueueFull, Request, Stopped, TooLarge
from .config import Config
from .metrics import Metrics
from .model import LoadedModel, ModelError, load
from .optimize import optimize
from .tensors import Outputs, buckets_up_to
from .warmup import load_sample, warm_up

log = logging.getLogger(__name__)

THREAD_NAME = "torchfleet-shadow"
LATENCY_WINDOW = 1024  # pairs of model times the summary's percentiles are taken over
SHADOW_DELAY_S = 0.005  # how long the candidate's batch waits to fill: nobody waits for it


@dataclass(frozen=True)
class Comparison:
    instances: int
    max_abs_diff: float
    argmax_agree: int | None  # instances whose argmax agreed (None: no class dimension)
    topk_overlap: float | None  # sum over instances of |top-k(live) & top-k(cand)| / k
    mismatch: str = ""  # why the outputs could not be compared ("" when they could)


def _tensors(out: Outputs) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out, key=str) for t in _tensors(out[k])]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def compare(live: Outputs, cand: Outputs, k: int) -> Comparison:
    """How far the candidate's outputs are from the live ones (pure: tests call it directly)."""
    a, b = _tensors(live), _tensors(cand)
    n = int(a[0].shape[0]) if a and a[0].dim() else 1
    if len(a) != len(b) or not a:
        return Comparison(n, float("inf"), None, None, f"{len(b)} output(s), not {len(a)}")
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return Comparison(
                n, float("inf"), None, None, f"shape {tuple(y.shape)}, not {tuple(x.shape)}"
            )
    worst = 0.0
    for x, y in zip(a, b):
        if x.numel():
            d = (x.double() - y.double()).abs().nan_to_num(float("inf"))
            worst = max(worst, float(d.max()))
    first, other = a[0], b[0]
    if first.dim() < 2 or not first.is_floating_point():
        return Comparison(n, worst, None, None)
    flat, oflat = first.reshape(n, -1), other.reshape(n, -1)
    agree = int((flat.argmax(1) == oflat.argmax(1)).sum())
    kk = min(k, flat.shape[1])
    top, otop = flat.topk(kk, 1).indices, oflat.topk(kk, 1).indices
    shared = (top.unsqueeze(2) == otop.unsqueeze(1)).any(2).sum(1)
    return Comparison(n, worst, agree, float(shared.sum()) / kk)


def _one_torch_thread_here() -> None:
    """One intra-op thread for the calling thread only. torch.set_num_threads also sets the
    default a thread takes at its first parallel op: a reload's new batcher thread would then
    run with one thread too. So: set 1 here, let this thread take it (one small op), and put
    the default back from a helper thread, whose own count nobody uses."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.ones(2, 2) @ torch.ones(2, 2)
    helper = threading.Thread(target=torch.set_num_threads, args=(before,), name="torch-threads")
    helper.start()
    helper.join()


def _lowest_priority() -> None:
    """nice 19 for the calling thread only (Linux: a thread id is a PRIO_PROCESS target)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed: run at normal priority
        log.debug("shadow thread priority unchanged: %s", exc)


class Shadow:
    def __init__(self, config: Config, metrics: Metrics, rng: random.Random | None = None) -> None:
        self.config = config
        self.sample = config.shadow_sample
        self.max_queue = config.shadow_max_queue
        self.top_k = config.shadow_top_k
        self._metrics = metrics
        self._rng = rng or random.Random()
        self.state = "loading"  # loading -> ready -> stopped, or failed
        self.error: str | None = None
        self.version: str | None = None
        self._batcher: Batcher | None = None
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._instances = 0
        self._agree = 0
        self._agree_n = 0
        self._overlap = 0.0
        self._worst = 0.0
        self._times: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=LATENCY_WINDOW
        )

    # --- building ------------------------------------------------------------------------------

    def start(self, live: LoadedModel, buckets: list[int], module: Any = None) -> None:
        """Build the candidate in its own thread, which then serves it; returns at once."""

        def build_then_serve() -> None:
            _one_torch_thread_here()
            _lowest_priority()
            try:
                batcher = self._build(live, buckets, module)
            except Exception as exc:  # the candidate's failure is never the serving model's
                self.error = (
                    str(exc) if isinstance(exc, ModelError) else f"{type(exc).__name__}: {exc}"
                )
                self.state = "failed"
                self._metrics.shadow_loads.labels(result="failed").inc()
                log.error("shadow candidate not loaded: %s", self.error)
                return
            self._batcher = batcher
            if self.state == "stopped":  # closed while it warmed
                return
            self.state = "ready"
            self._metrics.shadow_loads.labels(result="ok").inc()
            log.info(
                "shadow candidate %s serving %.0f %% of requests", self.version, self.sample * 100
            )
            batcher.serve_here()

        threading.Thread(target=build_then_serve, name=THREAD_NAME, daemon=True).start()

    def _build(self, live: LoadedModel, buckets: list[int], module: Any) -> Batcher:
        cfg = self.config.replace(model=self.config.shadow_model, metadata=None)
        loaded = load(cfg, module)
        if module is not None and loaded.version == "module":
            loaded.version = "shadow-module"
        want, got = live.metadata, loaded.metadata
        if (want.input_shape, want.dtype) != (got.input_shape, got.dtype):
            raise ModelError(
                f"config key 'shadow_model': the candidate takes {got.dtype} "
                f"{list(got.input_shape)}, the serving model {want.dtype} {list(want.input_shape)}"
            )
        self.version = loaded.version
        sample = load_sample(cfg.sample_input, loaded.metadata)
        loaded = optimize(loaded, sample, cfg.optimize)
        # the batcher admits one full batch whatever its queue bound: the cap is kept within it
        cap = min(buckets[-1], self.max_queue)
        warmed = warm_up(loaded.predictor, sample, buckets_up_to(cap), cfg.warmup_iterations)
        return Batcher(loaded.predictor, warmed, SHADOW_DELAY_S, self.max_queue, quiet=True)

    def close(self) -> None:
        self.state = "stopped"
        if self._batcher is not None:
            self._batcher.close(0)  # a hung candidate keeps its (daemon) thread; nobody waits

    # --- the live path -------------------------------------------------------------------------

    def sampled(self) -> bool:
        if self._rng.random() >= self.sample:
            return False
        if self.state != "ready":  # still loading, failed, stopped
            self._count("dropped_not_ready")
            return False
        return True

    def offer(
        self, tensor: torch.Tensor, live: Outputs, live_s: float, live_queued: int, live_cap: int
    ) -> None:
        """Queue one live request for the candidate, or count why not; never waits or raises."""
        batcher = self._batcher
        if self.state != "ready" or batcher is None:
            return self._count("dropped_not_ready")
        if live_queued >= live_cap:
            return self._count("dropped_load")
        try:
            request = batcher.submit(tensor)
        except (QueueFull, TooLarge):
            return self._count("dropped_busy")
        except Stopped:
            return self._count("dropped_not_ready")
        request.add_done_callback(lambda: self._compared(request, live, live_s))

    # --- the candidate's thread -----------------------------------------------------------------

    def _compared(self, request: Request, live: Outputs, live_s: float) -> None:
        try:
            cand = request.result(0)
        except Exception as exc:
            self._count("error")
            log.debug("shadow candidate %s failed: %s", self.version, exc)
            return
        c = compare(live, cand, self.top_k)
        if c.mismatch:
            self._count("mismatch")
            log.debug(
                "shadow candidate %s answered differently shaped outputs: %s",
                self.version,
                c.mismatch,
            )
            return
        m, v = self._metrics, self.version or ""
        with self._lock:
            self._counts["compared"] += 1
            self._instances += c.instances
            self._worst = max(self._worst, c.max_abs_diff)
            if c.argmax_agree is not None and c.topk_overlap is not None:
                self._agree += c.argmax_agree
                self._agree_n += c.instances
                self._overlap += c.topk_overlap
            self._times.append((live_s, request.model_s))
        m.shadow_requests.labels(model_version=v, result="compared").inc()
        m.shadow_instances.labels(model_version=v).inc(c.instances)
        m.shadow_max_abs_diff.labels(model_version=v).observe(c.max_abs_diff)
        if c.argmax_agree is not None and c.topk_overlap is not None:
            m.shadow_argmax_agreements.labels(model_version=v).inc(c.argmax_agree)
            m.shadow_topk_overlap.labels(model_version=v).inc(c.topk_overlap)
        m.shadow_duration.labels(model_version=v, model="candidate").observe(request.model_s)
        m.shadow_duration.labels(model_version=v, model="live").observe(live_s)

    def _count(self, result: str) -> None:
        with self._lock:
            self._counts[result] += 1
        self._metrics.shadow_requests.labels(model_version=self.version or "", result=result).inc()

    # --- the model card ------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self._counts)
            times = list(self._times)
            agree_n, agree, overlap = self._agree_n, self._agree, self._overlap
            instances, worst = self._instances, self._worst
        out: dict[str, Any] = {
            "state": self.state,
            "model_version": self.version,
            "model": self.config.shadow_model,
            "sample": self.sample,
            "error": self.error,
            "requests": {k: counts.get(k, 0) for k in RESULTS},
            "instances": instances,
            "max_abs_diff": worst if instances else None,
            "argmax_agreement": round(agree / agree_n, 6) if agree_n else None,
            "topk_overlap": round(overlap / agree_n, 6) if agree_n else None,
            "top_k": self.top_k,
            "busy_s": self._busy_s(),
        }
        if times:
            out["model_seconds"] = {
                side: {"p50": _quantile(xs, 0.5), "p99": _quantile(xs, 0.99)}
                for side, xs in (
                    ("live", [t[0] for t in times]),
                    ("candidate", [t[1] for t in times]),
                )
            }
        return out

    def _busy_s(self) -> float | None:
        """How long the candidate's running batch has run (a hung candidate shows here)."""
        b = self._batcher
        since = b.busy_since if b is not None else None
        return None if since is None else round(time.monotonic() - since, 3)


RESULTS = ("compared", "error", "mismatch", "dropped_load", "dropped_busy", "dropped_not_ready")


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 6)


__all__ = ["RESULTS", "Comparison", "Shadow", "compare"]
