"""One model replica's worker: takes batches from the shared queue, pads, runs, splits them.

Contract. A `Worker` owns one replica's `Predictor` (its device), the run times warm-up measured
for its buckets and, on an unpinned CPU replica, the `ThreadTuner`. Its loop (`loop()`, run in
the thread that warmed the replica: see Batcher.serve_here) asks the `Batcher` for the next
batch (`Batcher.next_batch`), runs it and hands every chunk its rows; the queue, the cap and the
batch-forming rules are the batcher's, shared by every worker, so an idle replica takes the next
request the moment one is queued while another replica is busy.
- A model failure fails that batch's requests, never the worker.
- CUDA out of memory: free the cache, lower the (shared) cap below the failing bucket, split the
  batch in halves and retry; only a single instance that does not fit alone fails
  (`OutOfMemory`).
- A sticky device error (compat.is_device_lost: the CUDA context is gone, every later call would
  fail too) fails the batch with `ReplicaLost` and stops the worker: the batcher reports it
  (`on_lost`) and the other replicas take the queue; the runtime reports the node degraded.
- Torch threads: with a `ThreadTuner` (threadtune.py) each batch runs with the intra-op count
  it asks for, set in this thread, and is reported back.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from . import compat
from .model import Predictor
from .tensors import Outputs, bucket_for, concat_outputs, split_outputs
from .threadtune import ThreadTuner

if TYPE_CHECKING:
    from .batcher import Batcher, _Chunk
    from .metrics import DeviceMetrics

log = logging.getLogger(__name__)

RECENT_BATCHES = 32  # per replica, shown in /v1/model and by `diagnose`


class OutOfMemory(Exception):
    """One instance alone does not fit in device memory."""


class ReplicaLost(Exception):
    """The replica's device failed for good (a sticky CUDA error); other replicas go on."""


@dataclass(frozen=True)
class BatchInfo:
    """What one model run looked like; passed to `on_batch` hooks (tests, logging)."""

    size: int  # real instances
    bucket: int  # size after padding
    chunks: int
    # "full": cap reached or next chunk would overflow; "deadline": max_delay passed; "idle": no
    # other request on its way (wait_for_arrivals); "draining"
    reason: str
    oldest_wait_s: float
    model_s: float = 0.0  # the forward with its pad and split
    device: str = ""  # the replica that ran it


class Worker:
    def __init__(
        self,
        predictor: Predictor,
        label: str = "",
        bucket_seconds: dict[int, float] | None = None,
        thread_tuner: ThreadTuner | None = None,
        threads: int = 0,
    ) -> None:
        self.predictor = predictor
        self.label = label or str(predictor.device)
        self.bucket_s = dict(bucket_seconds or {})  # bucket -> seconds of one run (warm-up)
        self.thread_tuner = thread_tuner
        self.threads = threads  # the intra-op count this worker runs with (0: the process's)
        self.busy_since: float | None = None  # monotonic start of the running batch
        self.running: list[_Chunk] = []  # the chunks of the running batch (abort fails them)
        self.lost: str | None = None  # why the replica left, once it has
        self.batcher: Batcher | None = None
        self.metrics: DeviceMetrics | None = None
        self.busy_s = 0.0  # seconds spent running batches
        # the last batches: (unix time, size, bucket, reason, model seconds, failed)
        self.recent: deque[tuple[float, int, int, str, float, bool]] = deque(maxlen=RECENT_BATCHES)

    # --- the loop --------------------------------------------------------------------------

    def loop(self) -> None:
        b = self.batcher
        assert b is not None
        while True:
            nxt = b.next_batch(self)
            if nxt is None:
                return
            chunks, reason = nxt
            self.run(chunks, reason)
            if self.lost is not None:
                b.worker_lost(self)
                return

    def run(self, chunks: list[_Chunk], reason: str) -> None:
        b = self.batcher
        assert b is not None
        clock = b.clock
        start = clock()
        self.busy_since = start
        size = sum(c.n for c in chunks)
        for c in chunks:
            c.request._started(start, self.label)
        model_s = 0.0
        failure: BaseException | None = None
        outputs = None
        tuner = self.thread_tuner
        if tuner is not None:
            self._set_threads(tuner.threads(start))
        try:
            inputs = chunks[0].tensor if len(chunks) == 1 else torch.cat([c.tensor for c in chunks])
            t0 = time.perf_counter()
            outputs = self.run_split(inputs)
            model_s = time.perf_counter() - t0
            if tuner is not None:
                self._tuned(tuner, size, start)
        except BaseException as exc:  # the model's failure is every caller's, never the worker's
            if compat.is_device_lost(exc):
                self.lost = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                exc = ReplicaLost(
                    f"replica {self.label} failed ({self.lost}); retry: another replica or node "
                    "serves it"
                )
            log.log(
                logging.DEBUG if b.quiet else logging.ERROR,
                "batch of %d on %s failed: %s",
                size,
                self.label,
                exc,
                exc_info=not isinstance(exc, (OutOfMemory, ReplicaLost)),
            )
            failure = exc
        finally:
            elapsed = clock() - start
            self.busy_s += elapsed
            b.ran(size, elapsed)
            self.busy_since = None
            with b.cond:
                self.running = []
        # metrics and hooks before the answers: a client that saw its answer finds its batch counted
        bucket = bucket_for(min(size, b.cap), b.buckets)
        self.recent.append((time.time(), size, bucket, reason, model_s, failure is not None))
        m = self.metrics
        if m is not None:
            m.busy.inc(elapsed)
            if failure is None:
                m.batch_size.observe(size)
                m.stage["model"].observe(model_s)
        if b.on_batch:
            info = BatchInfo(
                size,
                bucket,
                len(chunks),
                reason,
                start - chunks[0].enqueued_at,
                model_s,
                self.label,
            )
            for hook in b.on_batch:
                hook(info)
        if failure is not None:
            for c in chunks:
                c.request._fail(failure)
            return
        offset = 0
        counted: set[int] = set()  # a request with several chunks in this batch ran once
        for c in chunks:
            first = id(c.request) not in counted
            counted.add(id(c.request))
            c.request._deliver(
                c.index, split_outputs(outputs, offset, offset + c.n), model_s if first else 0.0
            )
            offset += c.n

    def _set_threads(self, n: int) -> None:
        if n != self.threads:
            torch.set_num_threads(n)  # OpenMP keeps it per thread: this worker's runs only
            self.threads = n
            if self.metrics is not None:
                self.metrics.torch_threads.set(n)

    def _tuned(self, tuner: ThreadTuner, size: int, start: float) -> None:
        assert self.batcher is not None
        if tuner.record(size, start, self.batcher.clock()):
            v = tuner.last
            log.log(
                logging.INFO if v["changed"] else logging.DEBUG,
                "torch threads under this load: %d (instances/s served by thread count: %s)",
                v["threads"],
                v["items_per_s"],
            )

    def run_split(self, inputs: torch.Tensor) -> Outputs:
        b = self.batcher
        assert b is not None
        n = int(inputs.shape[0])
        cap = b.cap
        if n > cap:  # the cap was lowered after this batch formed
            return concat_outputs([self.run_split(inputs[i : i + cap]) for i in range(0, n, cap)])
        bucket = bucket_for(n, b.buckets)
        padded = inputs
        if bucket > n:
            padded = torch.cat([inputs, inputs.new_zeros((bucket - n, *inputs.shape[1:]))])
        try:
            outputs = self.predictor(padded)
        except RuntimeError as exc:
            if not compat.is_oom(exc):
                raise
            compat.cuda_empty_cache()
            if self.metrics is not None:
                self.metrics.oom.inc()
            if bucket == 1:
                raise OutOfMemory("one instance does not fit in device memory") from None
            b.lower_cap(below=bucket)
            if n == 1:
                return self.run_split(inputs)
            half = (n + 1) // 2
            log.warning(
                "out of memory at batch %d on %s: split into %d + %d",
                bucket,
                self.label,
                half,
                n - half,
            )
            return concat_outputs([self.run_split(inputs[:half]), self.run_split(inputs[half:])])
        return outputs if bucket == n else split_outputs(outputs, 0, n)


Hook = Callable[[BatchInfo], None]
