"""The dynamic batcher: one bounded queue that every replica's worker takes its batches from.

Contract (the shape of LitServe's loop and BentoML's dispatcher, kept self-contained):
- `submit(tensor)` splits a request into chunks of at most the cap, admits them only if the
  queue has room for all of them (else `QueueFull` at once, never unbounded latency; a request
  larger than `max_queue` instances can never fit and is `TooLarge` at once) and returns a
  `Request` whose `result()` (or done callback) joins the chunks' outputs in order.
- `max_queue` bounds instances waiting, whatever the size of one request; it is at least the
  cap, so one full batch is always admissible.
- Workers (worker.py, one per model replica) ask `next_batch`. One idle worker at a time forms
  a batch: it takes the oldest chunk, then keeps adding chunks until the batch holds `cap`
  instances, the next chunk would overflow it, or `max_delay` has passed since the oldest chunk
  arrived (fill-or-timeout). With `wait_for_arrivals` (the server's default, config
  `batch_wait: arrivals`) it waits only while other requests are being received (announced
  with `expect()`, not yet submitted): a lone request at low load runs at once instead of
  paying `max_delay` for company that is not coming. Every queue change wakes every waiting
  worker, so while one replica runs a batch an idle one takes the next request at once: a
  request never waits for a busy replica while another is idle (longer than a thread's wake-up,
  plus `max_delay` with `batch_wait: always`). The worker pads the batch to the nearest warmed
  bucket (the buckets and the cap are shared: every replica warmed them), runs it, and hands
  each chunk its rows.
- Padding or trimming: with the buckets' measured run times (the forming worker's
  `bucket_seconds`, warm-up's fastest runs), a batch that falls between two buckets is cut
  down to the lower one when that serves more instances per second than padding up (more
  requests are waiting) or ends sooner for every request (nothing else is coming); the rest
  stays at the head of the queue for the next batch. Closed-loop clients at c=32 with a cap of
  32 left batches of 17-31 padded to 32: up to half of every run was zeros. Without times (none
  measured) it always pads.
- A worker whose replica is lost (worker.py) leaves: `on_lost(worker)` reports it, the others
  go on; when none is left the queue is failed with `ReplicaLost` at once.
"""

from __future__ import annotations

import collections
import collections.abc
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .metrics import Metrics
from .model import Predictor
from .tensors import Outputs, bucket_for, concat_outputs
from .threadtune import ThreadTuner
from .worker import BatchInfo, OutOfMemory, ReplicaLost, Worker

log = logging.getLogger(__name__)

__all__ = [
    "BatchInfo",
    "Batcher",
    "OutOfMemory",
    "QueueFull",
    "ReplicaLost",
    "Request",
    "Stopped",
    "TooLarge",
    "Worker",
]


class TooLarge(Exception):
    """A request holds more instances than the queue can ever admit (max_queue)."""


class QueueFull(Exception):
    def __init__(self, retry_after_s: int, queued: int, limit: int) -> None:
        super().__init__(
            f"the queue holds {queued} of {limit} instances; retry in {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


class Stopped(Exception):
    """The batcher is closed; no more work is accepted."""


class Request:
    """One caller's instances, possibly split into several chunks. Completion is a callback
    (`add_done_callback`, run in the worker's thread) or a blocking `result()`.

    The worker's side of the contract: `started` when a batch carrying one of its chunks begins,
    then per chunk `deliver` (its outputs) or `fail` (the batch's error); the first failure or the
    last delivery settles the request."""

    def __init__(self, n_chunks: int) -> None:
        self._parts: list[Outputs] = [None] * n_chunks
        self._left = n_chunks
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._settled = False  # delivered or failed (under _lock): _finish runs once
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], None]] = []
        self.enqueued_at = 0.0
        self.started_at: float | None = None  # when the first of its batches began
        self.device = ""  # the replica that ran (the first of) its batches
        self.model_s = 0.0  # seconds of the model runs that carried its chunks

    def started(self, at: float, device: str) -> None:
        if self.started_at is None or at < self.started_at:
            self.started_at = at
            self.device = device

    def _finish(self) -> None:
        self._done.set()
        for cb in self._callbacks:
            cb()

    def deliver(self, index: int, outputs: Outputs, model_s: float) -> None:
        with self._lock:
            if self._settled:  # failed already (another chunk's batch, Batcher.abort)
                return
            self._parts[index] = outputs
            self.model_s += model_s
            self._left -= 1
            last = self._settled = self._left == 0
        if last:
            self._finish()

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._settled:  # the first outcome wins; callbacks run once
                return
            self._settled = True
            self._error = exc
        self._finish()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def done(self) -> bool:
        return self._done.is_set()

    @property
    def queue_s(self) -> float:
        return 0.0 if self.started_at is None else max(0.0, self.started_at - self.enqueued_at)

    def result(self, timeout: float | None = None) -> Outputs:
        if not self._done.wait(timeout):
            raise TimeoutError("the prediction did not finish in time")
        if self._error is not None:
            raise self._error
        return concat_outputs(self._parts)


@dataclass
class _Chunk:
    request: Request
    index: int
    tensor: torch.Tensor
    enqueued_at: float

    @property
    def n(self) -> int:
        return int(self.tensor.shape[0])


class Batcher:
    def __init__(
        self,
        predictor: Predictor | Sequence[Worker],
        buckets: list[int],
        max_delay_s: float,
        max_queue: int,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wait_for_arrivals: bool = False,
        bucket_seconds: dict[int, float] | None = None,
        thread_tuner: ThreadTuner | None = None,
        quiet: bool = False,
    ) -> None:
        # a failing batch is logged at debug: a shadow candidate's failures are counted instead
        self.quiet = quiet
        """`predictor`: one replica's (a worker is made for it with `bucket_seconds` and
        `thread_tuner`), or the workers of every replica."""
        if isinstance(predictor, collections.abc.Sequence):
            workers: list[Worker] = list(predictor)
        else:
            workers = [Worker(predictor, "", bucket_seconds, thread_tuner)]
        self.workers = workers
        for w in workers:
            w.batcher = self
        self.buckets = list(buckets)
        self.max_delay_s = max_delay_s
        # A single full batch must always be admissible, whatever max_queue says.
        self.max_queue = max(max_queue, self.buckets[-1])
        self._metrics: Metrics | None = None
        self.clock = clock
        self._queue: collections.deque[_Chunk] = collections.deque()
        self._queued = 0  # instances in the queue
        self.cond = threading.Condition()
        self._stopping = False
        self._wait_for_arrivals = wait_for_arrivals
        self._expected = 0  # requests being received: announced by expect(), not yet submitted
        self._forming: Worker | None = None  # the worker filling the next batch
        self._idle = 0  # workers waiting in next_batch for a batch to form
        self._seconds_per_instance = 0.0  # EWMA, for Retry-After
        self.on_batch: list[Callable[[BatchInfo], None]] = []
        self.on_lost: list[Callable[[Worker], None]] = []
        self._threads: dict[int, threading.Thread] = {}  # worker index -> its thread
        if metrics is not None:
            self.attach_metrics(metrics)

    # --- public -----------------------------------------------------------------------------

    @property
    def cap(self) -> int:
        return self.buckets[-1]

    @property
    def capacity(self) -> float | None:
        """Instances per second the node sustains with batches up to its cap: per live replica
        the best rate of its warmed buckets (bucket over warm-up's fastest run of it; the cap
        is the largest bucket within the latency budget at most a quarter below that rate, so
        noise that moves the cap by one bucket barely moves this), summed. None when no
        replica timed its buckets. A rollout's capacity guard compares it between versions."""
        cap = self.cap
        rates = [
            max(b / s for b, s in w.bucket_s.items() if b <= cap and s > 0)
            for w in self.live_workers()
            if any(b <= cap and s > 0 for b, s in w.bucket_s.items())
        ]
        return sum(rates) if rates else None

    @property
    def thread_tuner(self) -> ThreadTuner | None:
        return self.workers[0].thread_tuner

    @property
    def threads(self) -> int:
        """The intra-op thread count the first worker set last (0: never set one)."""
        return self.workers[0].threads

    @property
    def busy_since(self) -> float | None:
        """When the longest-running batch of any replica began (None: all idle)."""
        times = [w.busy_since for w in self.workers if w.busy_since is not None]
        return min(times) if times else None

    @property
    def queued(self) -> int:
        return self._queued

    def live_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.lost is None]

    def is_alive(self) -> bool:
        """Some worker's thread runs (a lost replica's has ended)."""
        return any(t.is_alive() for t in self._threads.values())

    def start(self) -> None:
        """A thread per worker (tests; the runtime serves each in the thread that warmed it)."""
        for i, w in enumerate(self.workers):
            if i not in self._threads:
                t = threading.Thread(
                    target=w.loop, name=thread_name(w.label, len(self.workers)), daemon=True
                )
                self._threads[i] = t
                t.start()

    def serve_here(self, index: int = 0) -> None:
        """Run worker `index`'s loop in the calling thread until close(). The runtime warms a
        replica in the thread that will serve it: OpenMP thread teams and TorchScript's
        per-thread state belong to the calling thread, so a model warmed in another thread pays
        for them again on its first real batch."""
        self._threads[index] = threading.current_thread()
        self.workers[index].loop()

    def run_now(self, tensor: torch.Tensor, index: int = 0) -> Outputs:
        """Pad, run and split `tensor` on worker `index` in the caller's thread, bypassing the
        queue and its delay (the start-up self-test; only before that worker serves, as a model
        is not thread-safe)."""
        if index in self._threads:
            raise RuntimeError("run_now() is only allowed before the worker starts")
        return self.workers[index].run_direct(tensor)

    def check_now(self, sample: torch.Tensor, index: int = 0) -> None:
        """Worker `index`'s start-up self-check of its batch assembly, in the caller's thread
        (like run_now, only before that worker serves)."""
        if index in self._threads:
            raise RuntimeError("check_now() is only allowed before the worker starts")
        self.workers[index].check_pipeline(sample)

    def attach_metrics(self, metrics: Metrics) -> None:
        self._metrics = metrics
        metrics.set_cap(self.cap, self.capacity)
        for w in self.workers:
            w.metrics = metrics.device(w.label)
            w.metrics.torch_threads.set(w.threads or torch.get_num_threads())

    def expect(self) -> None:
        """A request has started to arrive (its body is being read and decoded). Pair it with
        `submit(..., expected=True)` or, if the request fails before that, `unexpect()`."""
        with self.cond:
            self._expected += 1

    def unexpect(self) -> None:
        with self.cond:
            self._expected -= 1
            self.cond.notify_all()

    def submit(self, tensor: torch.Tensor, expected: bool = False) -> Request:
        n = int(tensor.shape[0])
        cap = self.cap
        pieces = [tensor[i : i + cap] for i in range(0, n, cap)]
        request = Request(len(pieces))
        with self.cond:
            if expected:  # it has arrived, whether or not it is admitted
                self._expected -= 1
                self.cond.notify_all()
            if self._stopping:
                raise Stopped("the batcher is stopping")
            if n > self.max_queue:
                raise TooLarge(
                    f"the request holds {n} instances; at most {self.max_queue} can wait "
                    "(config key max_queue): split it"
                )
            if self._queued + n > self.max_queue:
                raise QueueFull(self._retry_after(), self._queued, self.max_queue)
            now = self.clock()
            request.enqueued_at = now
            for i, piece in enumerate(pieces):
                self._queue.append(_Chunk(request, i, piece, now))
            self._queued += n
            self._set_depth()
            self.cond.notify_all()
        return request

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting work, finish what is queued, stop every worker."""
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in list(self._threads.values()):
            if t is not threading.current_thread() and t.is_alive():
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def abort(self, exc: BaseException) -> int:
        """Stop now: fail every queued request and every running batch's with `exc` (their
        callers are answered at once) and stop the workers after their current model runs,
        whose outputs are dropped. The end of a drain that timed out; returns how many requests
        were failed."""
        with self.cond:
            self._stopping = True
            chunks = list(self._queue) + [c for w in self.workers for c in w.running]
            self._queue.clear()
            self._queued = 0
            self._set_depth()
            self.cond.notify_all()
        failed = {id(c.request): c.request for c in chunks}
        for request in failed.values():
            request.fail(exc)
        return len(failed)

    # --- used by the workers -----------------------------------------------------------------

    def ran(self, size: int, elapsed: float) -> None:
        """One batch of `size` instances took `elapsed` seconds (for Retry-After)."""
        self._seconds_per_instance = 0.8 * self._seconds_per_instance + 0.2 * elapsed / size

    def worker_lost(self, worker: Worker) -> None:
        """`worker`'s replica left (its loop has returned): tell the runtime; with no worker
        left, fail what waits instead of letting it wait for nobody."""
        log.error("replica %s left: %s", worker.label, worker.lost)
        for hook in self.on_lost:
            hook(worker)
        if not self.live_workers():
            self.abort(ReplicaLost("every replica of this node has failed; retry another node"))

    def lower_cap(self, below: int) -> None:
        kept = [b for b in self.buckets if b < below] or [1]
        if kept != self.buckets:
            log.warning("out of memory at batch %d: the batch cap is now %d", below, kept[-1])
            self.buckets = kept
            if self._metrics is not None:
                self._metrics.set_cap(self.cap, self.capacity)

    def _retry_after(self) -> int:
        live = max(1, len(self.live_workers()))
        return max(1, math.ceil(self._queued * self._seconds_per_instance / live))

    def _set_depth(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.set(self._queued)

    def _fitting(self) -> tuple[int, int]:
        """How many head chunks fit in one batch, and their instances (always >= 1 chunk)."""
        take, size = 0, 0
        for chunk in self._queue:
            if take and size + chunk.n > self.cap:
                break
            take += 1
            size += chunk.n
        return take, size

    def next_batch(self, worker: Worker, wait: bool = True) -> tuple[list[_Chunk], str] | None:
        """The next batch for `worker` (blocking), or None once closed and empty. With `wait`
        False (a worker gathering its next batch while its current one runs): only a batch that
        should run now by the same rules, and only when no other worker is idle (it takes
        the batch at once instead); else None at once."""
        with self.cond:
            if not wait:
                if (
                    not self._queue
                    or self._forming is not None
                    or self._idle > 0
                    or not self._ready(self._queue[0].enqueued_at + self.max_delay_s)
                ):
                    return None
            else:
                self._idle += 1
                try:
                    while not self._queue or self._forming is not None:
                        if self._stopping and not self._queue:
                            return None
                        self.cond.wait()
                finally:
                    self._idle -= 1
            self._forming = worker
            try:
                reason = self._fill()
                take, size = self._fitting()
                take, size = self._trimmed(
                    worker, take, size, more=take < len(self._queue) or self._expected > 0
                )
                chunks = [self._queue.popleft() for _ in range(take)]
                self._queued -= size
                self._set_depth()
                worker.running = worker.running + chunks
            finally:
                self._forming = None
                self.cond.notify_all()  # what is left is for another idle worker
            return chunks, reason

    def give_back(self, worker: Worker, chunks: list[_Chunk]) -> None:
        """Chunks `worker` took but will not run (its replica was lost before it started them)
        go back to the head of the queue, in order, for another replica."""
        back = {id(c) for c in chunks}
        with self.cond:
            self._queue.extendleft(reversed(chunks))
            self._queued += sum(c.n for c in chunks)
            worker.running = [c for c in worker.running if id(c) not in back]
            self._set_depth()
            self.cond.notify_all()

    def _ready(self, deadline: float) -> str:
        """Why the head batch should run now ("" while it should wait for company)."""
        take, size = self._fitting()
        if size >= self.cap or take < len(self._queue):
            return "full"
        if self._stopping:
            return "draining"
        if self._wait_for_arrivals and self._expected <= 0:
            return "idle"
        if deadline - self.clock() <= 0:
            return "deadline"
        return ""

    def _fill(self) -> str:
        """Wait (holding `cond`, which wait() releases) until the head batch should run; why."""
        deadline = self._queue[0].enqueued_at + self.max_delay_s
        while True:
            reason = self._ready(deadline)
            if reason:
                return reason
            self.cond.wait(deadline - self.clock())

    def _trimmed(self, worker: Worker, take: int, size: int, more: bool) -> tuple[int, int]:
        """The head chunks to run: all `take` of them padded up to their bucket, or fewer that
        fill the bucket below when the measured run times say that is better (module doc)."""
        if size > self.cap:  # one chunk from before the cap was lowered: run_split cuts it
            return take, size
        upper = bucket_for(size, self.buckets)
        lower = max(b for b in self.buckets if b <= size)
        t_up, t_low = worker.bucket_s.get(upper), worker.bucket_s.get(lower)
        if upper == size or t_up is None or t_low is None:
            return take, size
        if more:  # the leftover joins company in the next batch: compare instances per second
            better = lower / t_low > size / t_up
        else:  # the leftover runs right after: trimming must finish everyone sooner
            t_rest = worker.bucket_s.get(bucket_for(size - lower, self.buckets))
            better = t_rest is not None and t_low + t_rest < t_up
        if not better:
            return take, size
        k, n = 0, 0
        for chunk in self._queue:
            if n + chunk.n > lower:
                break
            k += 1
            n += chunk.n
        return (k, n) if k else (take, size)


def thread_name(label: str, replicas: int) -> str:
    """A worker thread's name: "torchfleet-batcher", with its replica's label when there are
    several (the app finds threads still in torch by this prefix)."""
    return "torchfleet-batcher" if replicas <= 1 else f"torchfleet-batcher-{label}"
