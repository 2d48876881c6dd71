"""One model replica's worker: takes batches from the shared queue, stages, runs, splits them.

Contract. A `Worker` owns one replica's `Predictor` (its device), the run times warm-up measured
for its buckets and, on an unpinned CPU replica, the `ThreadTuner`. Its loop (`loop()`, run in
the thread that warmed the replica: see Batcher.serve_here) asks the `Batcher` for the next
batch (`Batcher.next_batch`), runs it and hands every chunk its rows; the queue, the cap and the
batch-forming rules are the batcher's, shared by every worker, so an idle replica takes the next
request the moment one is queued while another replica is busy.
- A batch is gathered with one copy into the worker's staging buffer, padded to its bucket
  (staging.py: pinned and double-buffered on a CUDA replica, one non_blocking copy to the device
  per batch), then launched: the bucket's CUDA graph replays where warm-up kept one (graphs.py),
  else the model runs eagerly. Outputs come back to the host owning their memory (never a view
  of the staging buffer, which the next batches refill).
- Working ahead (`ahead`, on by default on a CUDA replica, whose model runs asynchronously):
  after launching a batch the worker asks the batcher for the next one without waiting
  (`next_batch(wait=False)`: only one that should run now, and only when no other replica is
  idle) and stages it while the device works, then waits for the launched batch's outputs. On
  CPU the model runs in this thread, so nothing would overlap: off.
- A model failure fails that batch's requests, never the worker.
- CUDA out of memory: free the cache, lower the (shared) cap below the failing bucket, split the
  batch in halves and retry (eagerly: `run_split`); only a single instance that does not fit
  alone fails (`OutOfMemory`). Graphs of buckets above a lowered cap are dropped, never replayed.
- A sticky device error (compat.is_device_lost: the CUDA context is gone, every later call would
  fail too) fails the batch with `ReplicaLost` and stops the worker: the batcher reports it
  (`on_lost`) and the other replicas take the queue (a batch staged ahead goes back to its
  head); the runtime reports the node degraded.
- Torch threads: with a `ThreadTuner` (threadtune.py) each batch runs with the intra-op count
  it asks for, set in this thread, and is reported back.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from . import compat
from .graphs import Graphs, why_not
from .model import Predictor
from .staging import Staged, Stager, detach
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


@dataclass
class _Batch:
    """One batch on its way through a worker: staged, launched, then finished."""

    tensors: list[torch.Tensor]
    size: int
    chunks: list[_Chunk] = field(default_factory=list)
    reason: str = ""
    staged: Staged | None = None  # None: the batch is larger than the cap (run_split cuts it)
    launched: Outputs = None  # the model's outputs on the device, not yet waited for
    failure: BaseException | None = None  # from staging or launching; _outputs decides
    start: float = 0.0  # batcher clock at launch
    t0: float = 0.0  # perf_counter at launch
    ahead_s: float = 0.0  # seconds spent gathering the next batch while this one ran


class Worker:
    def __init__(
        self,
        predictor: Predictor,
        label: str = "",
        bucket_seconds: dict[int, float] | None = None,
        thread_tuner: ThreadTuner | None = None,
        threads: int = 0,
        graphs: Graphs | None = None,
        ahead: bool | None = None,
    ) -> None:
        self.predictor = predictor
        self.label = label or str(predictor.device)
        self.bucket_s = dict(bucket_seconds or {})  # bucket -> seconds of one run (warm-up)
        self.thread_tuner = thread_tuner
        self.threads = threads  # the intra-op count this worker runs with (0: the process's)
        self.busy_since: float | None = None  # monotonic start of the running batch
        self.running: list[_Chunk] = []  # chunks taken and not answered (abort fails them)
        self.lost: str | None = None  # why the replica left, once it has
        self.batcher: Batcher | None = None
        self.metrics: DeviceMetrics | None = None
        self.busy_s = 0.0  # seconds spent running batches
        # the last batches: (unix time, size, bucket, reason, model seconds, failed)
        self.recent: deque[tuple[float, int, int, str, float, bool]] = deque(maxlen=RECENT_BATCHES)
        on_cuda = predictor.uses_torch and predictor.device.type == "cuda"
        # Work ahead where the model runs asynchronously (a CUDA replica): gather the next batch
        # while this one runs. On CPU the model runs in this thread: there is nothing to overlap.
        self.ahead = on_cuda if ahead is None else ahead
        self.stager = Stager(
            predictor.device if on_cuda else torch.device("cpu"), 2 if self.ahead else 1
        )
        self.graphs = (
            graphs
            if graphs is not None
            else Graphs(why_not(predictor, "auto") or "not captured for this batcher")
        )
        self.batches_ahead = 0  # batches gathered while the previous one ran

    def describe(self) -> dict[str, Any]:
        """The batch pipeline of this replica, for /v1/model."""
        return {
            "staging": self.stager.describe(),
            "work_ahead": self.ahead,
            "batches_ahead": self.batches_ahead,
            "cuda_graphs": self.graphs.describe(),
        }

    # --- the loop --------------------------------------------------------------------------

    def loop(self) -> None:
        b = self.batcher
        assert b is not None
        ahead: _Batch | None = None
        while True:
            batch, ahead = ahead, None
            if batch is None:
                nxt = b.next_batch(self)
                if nxt is None:
                    return
                batch = self._prepare(*nxt)
            self._launch(batch)
            if self.ahead and batch.failure is None:
                t0 = time.perf_counter()
                nxt = b.next_batch(self, wait=False)
                if nxt is not None:
                    ahead = self._prepare(*nxt)
                    self.batches_ahead += 1
                batch.ahead_s = time.perf_counter() - t0
            self._finish(batch)
            if self.lost is not None:
                if ahead is not None:  # not started here: another replica runs it
                    b.give_back(self, ahead.chunks)
                b.worker_lost(self)
                return

    def check_pipeline(self, sample: torch.Tensor) -> None:
        """Start-up self-check of this replica's batch assembly (staging.Stager.self_check)."""
        assert self.batcher is not None
        self.stager.self_check(sample, self.batcher.cap)

    def run_direct(self, tensor: torch.Tensor) -> Outputs:
        """`tensor` staged, run and fetched in the caller's thread, outside the queue (the
        start-up self-test: the path a batch takes, graphs included)."""
        batch = self._stage([tensor])
        self._start_model(batch)
        return self._outputs(batch)

    def _prepare(self, chunks: list[_Chunk], reason: str) -> _Batch:
        batch = self._stage([c.tensor for c in chunks])
        batch.chunks, batch.reason = chunks, reason
        return batch

    def _stage(self, tensors: list[torch.Tensor]) -> _Batch:
        b = self.batcher
        assert b is not None
        batch = _Batch(tensors, sum(int(t.shape[0]) for t in tensors))
        if batch.size <= b.cap:
            try:
                bucket = bucket_for(batch.size, b.buckets)
                batch.staged = self.stager.stage(tensors, bucket, b.cap)
            except BaseException as exc:  # e.g. a CUDA error copying it: the batch's, not ours
                batch.failure = exc
        return batch

    def _launch(self, batch: _Batch) -> None:
        b = self.batcher
        assert b is not None
        batch.start = b.clock()
        self.busy_since = batch.start
        for c in batch.chunks:
            c.request.started(batch.start, self.label)
        tuner = self.thread_tuner
        if tuner is not None:
            self._set_threads(tuner.threads(batch.start))
        self._start_model(batch)

    def _start_model(self, batch: _Batch) -> None:
        batch.t0 = time.perf_counter()
        staged = batch.staged
        if staged is None or batch.failure is not None:
            return
        cap = self.batcher.cap if self.batcher is not None else staged.bucket
        if staged.bucket > cap:  # staged ahead before an OOM lowered the cap: run_split cuts it
            batch.staged = None
            return
        try:
            graphs = self.graphs
            if graphs.buckets and graphs.buckets[-1] > cap:
                graphs.drop_above(cap)  # the cap was lowered (OOM): those never replay again
            if graphs.has(staged.bucket):
                batch.launched = graphs.replay(staged.device)
            else:
                batch.launched = self.predictor.launch(staged.device)
        except BaseException as exc:
            batch.failure = exc

    def _outputs(self, batch: _Batch) -> Outputs:
        """The batch's `size` rows of outputs on the host, owning their memory (waits for the
        device). An OOM or a batch above the cap takes run_split's way (split, lower the cap)."""
        staged, failure = batch.staged, batch.failure
        if staged is not None and failure is None:
            try:
                out = self.predictor.fetch(batch.launched)
                batch.launched = None
                if staged.bucket > staged.n:
                    out = split_outputs(out, 0, staged.n)
                return detach(out, staged)
            except RuntimeError as exc:
                failure = exc
        if failure is not None and not compat.is_oom(failure):
            raise failure
        if staged is not None:
            assert failure is not None
            self._out_of_memory(staged.bucket, staged.n)
            inputs = staged.host[: staged.n]  # its buffer is refilled two batches later
            return detach(self.run_split(inputs), staged)
        return self.run_split(torch.cat(batch.tensors))

    def _finish(self, batch: _Batch) -> None:
        b = self.batcher
        assert b is not None
        chunks, size, start = batch.chunks, batch.size, batch.start
        model_s = 0.0
        failure: BaseException | None = None
        outputs = None
        tuner = self.thread_tuner
        try:
            outputs = self._outputs(batch)
            model_s = max(0.0, time.perf_counter() - batch.t0 - batch.ahead_s)
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
            elapsed = b.clock() - start
            self.busy_s += elapsed
            b.ran(size, elapsed)
            self.busy_since = None
            done = {id(c) for c in chunks}
            with b.cond:
                self.running = [c for c in self.running if id(c) not in done]
        # metrics and hooks before the answers: a client that saw its answer finds its batch counted
        bucket = bucket_for(min(size, b.cap), b.buckets)
        self.recent.append((time.time(), size, bucket, batch.reason, model_s, failure is not None))
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
                batch.reason,
                start - chunks[0].enqueued_at,
                model_s,
                self.label,
            )
            for hook in b.on_batch:
                hook(info)
        if failure is not None:
            for c in chunks:
                c.request.fail(failure)
            return
        offset = 0
        counted: set[int] = set()  # a request with several chunks in this batch ran once
        for c in chunks:
            first = id(c.request) not in counted
            counted.add(id(c.request))
            c.request.deliver(
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
        """Eager runs of `inputs` padded to their bucket, cut at the cap and split in halves on
        a CUDA OOM (module doc): the way of a batch the staged path cannot take."""
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
            self._out_of_memory(bucket, n)
            if n == 1:
                return self.run_split(inputs)
            half = (n + 1) // 2
            return concat_outputs([self.run_split(inputs[:half]), self.run_split(inputs[half:])])
        return outputs if bucket == n else split_outputs(outputs, 0, n)

    def _out_of_memory(self, bucket: int, n: int) -> None:
        """A CUDA OOM at `bucket` (n real rows): free the cache, count it, lower the shared cap
        below it; raises OutOfMemory when one instance alone does not fit."""
        b = self.batcher
        assert b is not None
        compat.cuda_empty_cache()
        if self.metrics is not None:
            self.metrics.oom.inc()
        if bucket == 1:
            raise OutOfMemory("one instance does not fit in device memory") from None
        b.lower_cap(below=bucket)
        if n > 1:
            log.warning(
                "out of memory at batch %d on %s: split into %d + %d",
                bucket,
                self.label,
                (n + 1) // 2,
                n - (n + 1) // 2,
            )


Hook = Callable[[BatchInfo], None]
