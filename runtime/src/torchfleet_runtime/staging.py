"""Batch assembly: a batch's chunks gathered with one copy into a staging buffer allocated once.

Contract. A `Stager` belongs to one worker (one replica; worker.py). `stage(tensors, bucket)`
copies the rows of `tensors` (a batch's chunks, in order) into the next staging buffer, zeroes
the rows after them up to `bucket` (the padding: never a previous batch's rows) and returns a
`Staged` batch: `host`, the buffer's first `bucket` rows, and `device`, what the model reads.
- Buffers are allocated at the first batch with room for the cap (`rows`) and reused for every
  batch after it; the cap only ever goes down (OOM), so they never grow. A reload makes new
  workers, and new stagers.
- CUDA replicas: the buffers are pinned host memory and there are two of them, used in turn
  (double buffering: the worker gathers the next batch into one while the other's batch runs).
  Each batch goes to the device with ONE `.to(device, non_blocking=True)` on the stager's copy
  stream; a CUDA event recorded after that copy is waited on (by the host) before the buffer is
  filled again, and (by the compute stream) before the model reads the copy. Pinning per request
  would cost more than the plain copy it saves: the buffers are pinned once. Where no pinned
  memory can be had, the buffers are pageable (the copy is then synchronous) and
  `describe()["unpinned_reason"]` says why: a start never fails for it.
- CPU replicas: the model runs in the worker's thread, so a batch has finished with its buffer
  before the next is gathered; the buffer count is the worker's (two when it works ahead, as in
  tests). A batch that is a single chunk already at its bucket is passed as it is: no copy at all
  (today's path); any other batch costs one copy instead of concatenating and then padding.
- Answers must not keep the buffer alive: a model may return a view of its input (an identity,
  a slice), and the buffer is refilled two batches later while the answer is still being
  encoded. `detach(outputs, staged)` copies every output tensor that shares the staged rows'
  memory (a passed-through chunk's too: its memory is its sender's).
- Self-check at start-up (`self_check`, run by the replica's self-test): staging a padded batch
  near the cap is timed against the plain assembly (cat, pad, copy); clearly slower, and this
  replica assembles the plain way, with the reason in `describe()` and the log.
- Inputs travel at the dtype they arrive in (the model's input dtype: the codec decodes into
  it); precision is autocast's on the device (model.py), never a host-side conversion.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from . import compat
from .tensors import Outputs, make_batch

log = logging.getLogger(__name__)

CHECK_RUNS = 5  # per side at start-up: a few copies of the cap's rows
SLOWER = 1.1  # staging is turned off only when clearly slower: one short timing is noisy


@dataclass
class Staged:
    """One staged batch: `n` real rows, padded to `host.shape[0]` (its bucket)."""

    host: torch.Tensor  # the staging buffer's first `bucket` rows (or the chunk itself)
    device: torch.Tensor  # what the model reads: the device copy on CUDA, else `host`
    n: int
    buffer: int  # which staging buffer (-1: none, the chunk passed as it is)

    @property
    def bucket(self) -> int:
        return int(self.host.shape[0])


class Stager:
    def __init__(self, device: torch.device, buffers: int = 1) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.count = 2 if self.cuda else max(1, buffers)
        self._buffers: list[torch.Tensor] = []
        self._events: list[Any] = []  # torch.cuda.Event per buffer (CUDA only)
        self._next = 0
        self._copy_stream: Any = None
        self.fills = 0  # batches gathered into a buffer (tests and /v1/model)
        self.passed = 0  # batches passed through without a copy
        self.unpinned = ""  # why a CUDA replica's buffers are not pinned ("" when they are)
        self.checked = ""  # self_check's verdict
        self.off = ""  # why this replica assembles with cat and pad instead ("" when it stages)

    @property
    def rows(self) -> int:
        return int(self._buffers[0].shape[0]) if self._buffers else 0

    def describe(self) -> dict[str, Any]:
        return {
            "buffers": self.count,
            # allocated and pinned (pinning is asked of CUDA replicas only)
            "pinned": self.cuda
            and bool(self._buffers)
            and all(b.is_pinned() for b in self._buffers),
            "unpinned_reason": self.unpinned or None,
            "self_check": self.checked or None,
            "off_reason": self.off or None,
            "dtype": str(self._buffers[0].dtype).replace("torch.", "") if self._buffers else None,
            "rows": self.rows,
            "bytes": sum(b.numel() * b.element_size() for b in self._buffers),
            "batches_gathered": self.fills,
            "batches_passed_through": self.passed,
        }

    def _allocate(self, rows: int, like: torch.Tensor) -> None:
        shape = (rows, *like.shape[1:])
        try:
            self._buffers = [
                torch.empty(shape, dtype=like.dtype, pin_memory=self.cuda)
                for _ in range(self.count)
            ]
        except RuntimeError as exc:  # no page-locked memory to be had: serve from pageable
            if not self.cuda:
                raise
            self.unpinned = f"pinning failed ({str(exc).splitlines()[0][:200]})"
            log.warning("staging buffers on %s are not pinned: %s", self.device, self.unpinned)
            self._buffers = [torch.empty(shape, dtype=like.dtype) for _ in range(self.count)]
        if self.cuda:
            self._events = [None] * self.count
            self._copy_stream = torch.cuda.Stream(self.device)
        self._next = 0

    def self_check(self, sample: torch.Tensor, cap: int) -> None:
        """Time staging a padded batch near the cap (`cap - cap // 4` one-row chunks) against
        the plain assembly, alternating, best of `CHECK_RUNS` each (both waited for on CUDA);
        staging clearly slower (`SLOWER`) is turned off for this replica, with the reason in
        `off` and the log."""
        n = max(1, cap - cap // 4)
        if n == 1 and not self.cuda:
            return  # one row at bucket 1 passes as it is: nothing to compare
        chunks = list(make_batch(sample, n).split(1))
        best = {"plain": float("inf"), "staged": float("inf")}
        for _ in range(CHECK_RUNS):
            for name in best:
                t0 = time.perf_counter()
                if name == "plain":
                    plain(chunks, cap, self.device)
                else:
                    self._fill(chunks, cap, cap)
                if self.cuda:
                    torch.cuda.synchronize(self.device)
                best[name] = min(best[name], time.perf_counter() - t0)
        self.fills -= CHECK_RUNS  # the check's fills are not batches
        ratio = best["staged"] / best["plain"]
        self.checked = f"staging {ratio:.2f}x the plain assembly at batch {cap}"
        if ratio > SLOWER:
            self.off = f"{self.checked} (slower: cat and pad instead)"
            log.warning("staging turned off on %s: %s", self.device, self.off)

    def stage(self, tensors: list[torch.Tensor], bucket: int, rows: int) -> Staged:
        """Gather `tensors` (n rows in all, n <= bucket <= rows) into a buffer of `rows` rows."""
        n = sum(int(t.shape[0]) for t in tensors)
        first = tensors[0]
        if not self.cuda and len(tensors) == 1 and n == bucket:
            self.passed += 1
            return Staged(first, first, n, -1)
        if self.off:
            host = plain(tensors, bucket, None)
            return Staged(host, host.to(self.device, non_blocking=True), n, -1)
        return self._fill(tensors, bucket, rows)

    def _fill(self, tensors: list[torch.Tensor], bucket: int, rows: int) -> Staged:
        n = sum(int(t.shape[0]) for t in tensors)
        first = tensors[0]
        if (
            not self._buffers
            or self.rows < bucket
            or self._buffers[0].dtype != first.dtype
            or self._buffers[0].shape[1:] != first.shape[1:]
        ):
            self._allocate(max(rows, bucket), first)
        k = self._next
        self._next = (k + 1) % self.count
        event = self._events[k] if self.cuda else None
        if event is not None:
            event.synchronize()  # the copy out of this buffer (two batches ago) has completed
        buf = self._buffers[k]
        # one C++ call writes every chunk in place: half the time of cat + pad from a few rows
        # up, and faster than a copy_ per chunk (benchmarks/README.md, "The batch pipeline")
        torch.cat(tensors, out=buf[:n])
        if bucket > n:
            buf[n:bucket].zero_()
        host = buf[:bucket]
        self.fills += 1
        if not self.cuda:
            return Staged(host, host, n, k)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._copy_stream):
            dev = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._copy_stream)
        self._events[k] = event
        compute.wait_event(event)  # the model reads the copy only once it has landed
        dev.record_stream(compute)  # allocated on the copy stream, used on the compute stream
        return Staged(host, dev, n, k)


def plain(tensors: list[torch.Tensor], bucket: int, device: torch.device | None) -> torch.Tensor:
    """The assembly without a staging buffer: torch.cat of the rows, a second torch.cat for the
    padding, then (with `device`) the copy to it. What a replica whose staging measured slower
    does, and what staging is measured against."""
    n = sum(int(t.shape[0]) for t in tensors)
    x = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
    if bucket > n:
        x = torch.cat([x, x.new_zeros((bucket - n, *x.shape[1:]))])
    return x if device is None else x.to(device, non_blocking=True)


def detach(outputs: Outputs, staged: Staged) -> Outputs:
    """`outputs` with every tensor that shares the staged rows' memory copied out of it: the
    staging buffer's, or a passed-through request's own tensor (which may be a view of memory
    its sender reuses once it is answered)."""
    lo, hi = compat.storage_span(staged.host)
    return _copy_aliases(outputs, lo, hi)


def _copy_aliases(out: Outputs, lo: int, hi: int) -> Outputs:
    if isinstance(out, torch.Tensor):
        if out.device.type != "cpu" or out.numel() == 0:
            return out
        start, end = compat.storage_span(out)
        return out.clone() if start < hi and lo < end else out
    if isinstance(out, (tuple, list)):
        return type(out)(_copy_aliases(o, lo, hi) for o in out)
    if isinstance(out, dict):
        return {k: _copy_aliases(v, lo, hi) for k, v in out.items()}
    return out
