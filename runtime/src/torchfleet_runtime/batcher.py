"""The dynamic batcher: a bounded queue and one worker that forms, pads, runs and splits batches.

Contract (the shape of LitServe's loop and BentoML's dispatcher, kept self-contained):
- `submit(tensor)` splits a request into chunks of at most the cap, admits them only if the
  queue has room for all of them (else `QueueFull` at once, never unbounded latency; a request
  larger than `max_queue` instances can never fit and is `TooLarge` at once) and returns a
  `Request` whose `result()` (or done callback) joins the chunks' outputs in order.
- `max_queue` bounds instances waiting, whatever the size of one request; it is at least the
  cap, so one full batch is always admissible.
- The worker takes the oldest chunk, then keeps adding chunks until the batch holds `cap`
  instances, the next chunk would overflow it, or `max_delay` has passed since the oldest chunk
  arrived (fill-or-timeout). With `wait_for_arrivals` (the server's default, config
  `batch_wait: arrivals`) it waits only while other requests are being received (announced
  with `expect()`, not yet submitted): a lone request at low load runs at once instead of
  paying `max_delay` for company that is not coming. It pads the batch to the nearest warmed bucket, so the model only
  sees shapes warm-up ran, runs it, and hands each chunk its rows.
- Padding or trimming: with the buckets' measured run times (`bucket_seconds`, warm-up's
  fastest runs), a batch that falls between two buckets is cut down to the lower one when that
  serves more instances per second than padding up (more requests are waiting) or ends sooner
  for every request (nothing else is coming); the rest stays at the head of the queue for the
  next batch. Closed-loop clients at c=32 with a cap of 32 left batches of 17-31 padded to 32:
  up to half of every run was zeros. Without times (none measured) it always pads.
- Torch threads: with a `ThreadTuner` (threadtune.py) the worker runs each batch with the
  intra-op thread count it asks for, set in the worker's own thread, and reports the batch back.
- CUDA out of memory: free the cache, lower the cap below the failing bucket, split the batch in
  halves and retry; only a single instance that does not fit alone fails (`OutOfMemory`).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import compat
from .metrics import Metrics
from .model import Predictor
from .tensors import Outputs, bucket_for, concat_outputs, split_outputs
from .threadtune import ThreadTuner

log = logging.getLogger(__name__)


class TooLarge(Exception):
    """A request holds more instances than the queue can ever admit (max_queue)."""


class QueueFull(Exception):
    def __init__(self, retry_after_s: int, queued: int, limit: int) -> None:
        super().__init__(
            f"the queue holds {queued} of {limit} instances; retry in {retry_after_s} s"
        )
        self.retry_after_s = retry_after_s


class OutOfMemory(Exception):
    """One instance alone does not fit in device memory."""


class Stopped(Exception):
    """The batcher is closed; no more work is accepted."""


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


class Request:
    """One caller's instances, possibly split into several chunks. Completion is a callback
    (`add_done_callback`, run in the worker's thread) or a blocking `result()`."""

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
        self.model_s = 0.0  # seconds of the model runs that carried its chunks

    def _started(self, at: float) -> None:
        if self.started_at is None or at < self.started_at:
            self.started_at = at

    def _finish(self) -> None:
        self._done.set()
        for cb in self._callbacks:
            cb()

    def _deliver(self, index: int, outputs: Outputs, model_s: float) -> None:
        with self._lock:
            if self._settled:  # failed already (another chunk's batch, Batcher.abort)
                return
            self._parts[index] = outputs
            self.model_s += model_s
            self._left -= 1
            last = self._settled = self._left == 0
        if last:
            self._finish()

    def _fail(self, exc: BaseException) -> None:
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
        predictor: Predictor,
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
        self._predictor = predictor
        self._quiet = (
            quiet  # a failing batch logged at debug: a shadow candidate's failures are counted
        )
        self.thread_tuner = thread_tuner
        self._threads = 0  # the intra-op count this worker last set (0: as it found it)
        self.buckets = list(buckets)
        self._bucket_s = dict(bucket_seconds or {})  # bucket -> seconds of one run (warm-up)
        self.max_delay_s = max_delay_s
        # A single full batch must always be admissible, whatever max_queue says.
        self.max_queue = max(max_queue, self.buckets[-1])
        self._metrics = metrics
        self._clock = clock
        self._queue: collections.deque[_Chunk] = collections.deque()
        self._queued = 0  # instances in the queue
        self._cond = threading.Condition()
        self._stopping = False
        self._wait_for_arrivals = wait_for_arrivals
        self._expected = 0  # requests being received: announced by expect(), not yet submitted
        self._seconds_per_instance = 0.0  # EWMA, for Retry-After
        self.busy_since: float | None = None  # monotonic start of the running batch
        self._running: list[_Chunk] = []  # the chunks of the running batch (abort fails them)
        self.on_batch: list[Callable[[BatchInfo], None]] = []
        self._thread: threading.Thread | None = (
            None  # the worker: start() makes one, serve_here() is one
        )

    # --- public -----------------------------------------------------------------------------

    @property
    def cap(self) -> int:
        return self.buckets[-1]

    @property
    def threads(self) -> int:
        """The intra-op thread count this worker set last (0: never set one)."""
        return self._threads

    @property
    def queued(self) -> int:
        return self._queued

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="torchfleet-batcher", daemon=True
            )
            self._thread.start()

    def serve_here(self) -> None:
        """Run the worker loop in the calling thread until close(). The runtime warms a model in
        the thread that will serve it: OpenMP thread teams and TorchScript's per-thread state
        belong to the calling thread, so a model warmed in another thread pays for them again on
        its first real batch."""
        self._thread = threading.current_thread()
        self._loop()

    def run_now(self, tensor: torch.Tensor) -> Outputs:
        """Pad, run and split `tensor` in the caller's thread, bypassing the queue and its delay
        (the start-up self-test; only before start(), as the model is not thread-safe)."""
        if self._thread is not None:
            raise RuntimeError("run_now() is only allowed before the worker starts")
        return self._run_split(tensor)

    def attach_metrics(self, metrics: Metrics) -> None:
        self._metrics = metrics
        metrics.batch_cap.set(self.cap)
        metrics.torch_threads.set(self._threads or torch.get_num_threads())

    def expect(self) -> None:
        """A request has started to arrive (its body is being read and decoded). Pair it with
        `submit(..., expected=True)` or, if the request fails before that, `unexpect()`."""
        with self._cond:
            self._expected += 1

    def unexpect(self) -> None:
        with self._cond:
            self._expected -= 1
            self._cond.notify()

    def submit(self, tensor: torch.Tensor, expected: bool = False) -> Request:
        n = int(tensor.shape[0])
        cap = self.cap
        pieces = [tensor[i : i + cap] for i in range(0, n, cap)]
        request = Request(len(pieces))
        with self._cond:
            if expected:  # it has arrived, whether or not it is admitted
                self._expected -= 1
                self._cond.notify()
            if self._stopping:
                raise Stopped("the batcher is stopping")
            if n > self.max_queue:
                raise TooLarge(
                    f"the request holds {n} instances; at most {self.max_queue} can wait "
                    "(config key max_queue): split it"
                )
            if self._queued + n > self.max_queue:
                raise QueueFull(self._retry_after(), self._queued, self.max_queue)
            now = self._clock()
            request.enqueued_at = now
            for i, piece in enumerate(pieces):
                self._queue.append(_Chunk(request, i, piece, now))
            self._queued += n
            self._set_depth()
            self._cond.notify()
        return request

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting work, finish what is queued, stop the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout)

    def abort(self, exc: BaseException) -> int:
        """Stop now: fail every queued request and the running batch's with `exc` (their callers
        are answered at once) and stop the worker after its current model run, whose outputs are
        dropped. The end of a drain that timed out; returns how many requests were failed."""
        with self._cond:
            self._stopping = True
            chunks = list(self._queue) + list(self._running)
            self._queue.clear()
            self._queued = 0
            self._set_depth()
            self._cond.notify_all()
        failed = {id(c.request): c.request for c in chunks}
        for request in failed.values():
            request._fail(exc)
        return len(failed)

    # --- the worker ---------------------------------------------------------------------------

    def _retry_after(self) -> int:
        return max(1, math.ceil(self._queued * self._seconds_per_instance))

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

    def _next_batch(self) -> tuple[list[_Chunk], str] | None:
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            deadline = self._queue[0].enqueued_at + self.max_delay_s
            while True:
                take, size = self._fitting()
                if size >= self.cap or take < len(self._queue):
                    reason = "full"
                    break
                if self._stopping:
                    reason = "draining"
                    break
                if self._wait_for_arrivals and self._expected <= 0:
                    reason = "idle"
                    break
                remaining = deadline - self._clock()
                if remaining <= 0:
                    reason = "deadline"
                    break
                self._cond.wait(remaining)
            take, size = self._trimmed(
                take, size, more=take < len(self._queue) or self._expected > 0
            )
            chunks = [self._queue.popleft() for _ in range(take)]
            self._queued -= size
            self._set_depth()
            self._running = chunks
            return chunks, reason

    def _trimmed(self, take: int, size: int, more: bool) -> tuple[int, int]:
        """The head chunks to run: all `take` of them padded up to their bucket, or fewer that
        fill the bucket below when the measured run times say that is better (module doc)."""
        if size > self.cap:  # one chunk from before the cap was lowered: _run_split cuts it
            return take, size
        upper = bucket_for(size, self.buckets)
        lower = max(b for b in self.buckets if b <= size)
        t_up, t_low = self._bucket_s.get(upper), self._bucket_s.get(lower)
        if upper == size or t_up is None or t_low is None:
            return take, size
        if more:  # the leftover joins company in the next batch: compare instances per second
            better = lower / t_low > size / t_up
        else:  # the leftover runs right after: trimming must finish everyone sooner
            t_rest = self._bucket_s.get(bucket_for(size - lower, self.buckets))
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

    def _loop(self) -> None:
        while True:
            nxt = self._next_batch()
            if nxt is None:
                return
            chunks, reason = nxt
            self._run(chunks, reason)

    def _run(self, chunks: list[_Chunk], reason: str) -> None:
        start = self._clock()
        self.busy_since = start
        size = sum(c.n for c in chunks)
        for c in chunks:
            c.request._started(start)
        model_s = 0.0
        failure: BaseException | None = None
        outputs = None
        tuner = self.thread_tuner
        if tuner is not None:
            self._set_threads(tuner.threads(start))
        try:
            inputs = chunks[0].tensor if len(chunks) == 1 else torch.cat([c.tensor for c in chunks])
            t0 = time.perf_counter()
            outputs = self._run_split(inputs)
            model_s = time.perf_counter() - t0
            if tuner is not None:
                self._tuned(tuner, size, start)
        except (
            BaseException
        ) as exc:  # the model's failure is every caller's failure, never the worker's
            log.log(
                logging.DEBUG if self._quiet else logging.ERROR,
                "batch of %d failed: %s",
                size,
                exc,
                exc_info=not isinstance(exc, OutOfMemory),
            )
            failure = exc
        finally:
            elapsed = self._clock() - start
            self._seconds_per_instance = 0.8 * self._seconds_per_instance + 0.2 * elapsed / size
            self.busy_since = None
            with self._cond:
                self._running = []
        # metrics and hooks before the answers: a client that saw its answer finds its batch counted
        if failure is None and self._metrics is not None:
            self._metrics.batch_size.observe(size)
            self._metrics.stage_of["model"].observe(model_s)
        if self.on_batch:
            info = BatchInfo(
                size,
                bucket_for(min(size, self.cap), self.buckets),
                len(chunks),
                reason,
                start - chunks[0].enqueued_at,
                model_s,
            )
            for hook in self.on_batch:
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
        if n != self._threads:
            torch.set_num_threads(n)  # OpenMP keeps it per thread: this worker's runs only
            self._threads = n
            if self._metrics is not None:
                self._metrics.torch_threads.set(n)

    def _tuned(self, tuner: ThreadTuner, size: int, start: float) -> None:
        if tuner.record(size, start, self._clock()):
            v = tuner.last
            log.log(
                logging.INFO if v["changed"] else logging.DEBUG,
                "torch threads under this load: %d (instances/s served by thread count: %s)",
                v["threads"],
                v["items_per_s"],
            )

    def _run_split(self, inputs: torch.Tensor) -> Outputs:
        n = int(inputs.shape[0])
        if n > self.cap:  # the cap was lowered after this batch formed
            return concat_outputs(
                [self._run_split(inputs[i : i + self.cap]) for i in range(0, n, self.cap)]
            )
        bucket = bucket_for(n, self.buckets)
        padded = inputs
        if bucket > n:
            padded = torch.cat([inputs, inputs.new_zeros((bucket - n, *inputs.shape[1:]))])
        try:
            outputs = self._predictor(padded)
        except RuntimeError as exc:
            if not compat.is_oom(exc):
                raise
            compat.cuda_empty_cache()
            if self._metrics is not None:
                self._metrics.oom.inc()
            if bucket == 1:
                raise OutOfMemory("one instance does not fit in device memory") from None
            self._lower_cap(below=bucket)
            if n == 1:
                return self._run_split(inputs)
            half = (n + 1) // 2
            log.warning("out of memory at batch %d: split into %d + %d", bucket, half, n - half)
            return concat_outputs([self._run_split(inputs[:half]), self._run_split(inputs[half:])])
        return outputs if bucket == n else split_outputs(outputs, 0, n)

    def _lower_cap(self, below: int) -> None:
        kept = [b for b in self.buckets if b < below] or [1]
        if kept != self.buckets:
            log.warning("out of memory at batch %d: the batch cap is now %d", below, kept[-1])
            self.buckets = kept
            if self._metrics is not None:
                self._metrics.batch_cap.set(self.cap)
