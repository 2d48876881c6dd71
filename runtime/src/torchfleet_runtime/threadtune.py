"""Torch's intra-op thread count, chosen online from what the runtime really serves.

One thread per CPU is fastest for the model alone, but the HTTP side (parsing, JSON decode and
encode, writes: one event-loop thread) runs on the same CPUs. Under load the model's OpenMP
threads and the loop take CPU from each other, and one thread fewer can serve more; at low load
it cannot. Which way a model goes depends on how well it parallelises and how much HTTP work each
instance brings: on a 2-CPU machine at c=32 the demo model served more with one thread and the
3x wider one with two, and the batch run time alone did not show it, since what one thread gives
back is CPU for the loop (figures: benchmarks/README.md, "Torch threads under load"). So this
measures served instances per second.

`ThreadTuner` alternates the two counts (`high`, one per usable CPU, and `high - 1`) in stretches
of `stretch` batches, `rounds` stretches each, interleaved so both meet the same moments of a noisy
machine; a stretch's rate is its instances over the wall time from its first batch's start to its
last batch's end (waiting for requests included: that is where a starved HTTP loop shows). It keeps
`high - 1` only when its median rate beats `high`'s by more than `margin` (an arrival-bound light
load serves the same with both, and keeps one per CPU), holds the choice for `hold_s`, then
measures again: the load changes. A load that changes sooner shows in the batch size (one client:
batches of 1; 32 clients: full batches), and which count wins depends on it, so the hold also ends
when the median size of the last `stretch * 2` batches (one burst does not count) is more than
`regime` times larger or smaller than the measurement's mean. Pure logic (no torch, the caller's
clock): the batcher's worker asks `threads()` before each batch, sets it with
`torch.set_num_threads` in its own thread (OpenMP keeps the count per thread) and reports the batch
with `record()`.
"""

from __future__ import annotations

import statistics
from collections import deque


class ThreadTuner:
    def __init__(
        self,
        high: int,
        stretch: int = 8,
        rounds: int = 4,
        margin: float = 0.04,
        hold_s: float = 120.0,
        regime: float = 1.5,
    ) -> None:
        if high < 2:
            raise ValueError("thread tuning needs at least 2 usable CPUs")
        self.high, self.low = high, high - 1
        self.stretch, self.rounds, self.margin, self.hold_s = stretch, rounds, margin, hold_s
        self.regime = regime
        self.chosen = high  # the count held between measurements
        self.last: dict[str, object] = {}  # the last verdict: the model card and the log
        self._begin()

    def _begin(self) -> None:
        self.current = self.high
        self._measuring = True
        self._rates: dict[int, list[float]] = {self.high: [], self.low: []}
        self._stretch_items = 0
        self._stretch_batches = 0
        self._stretch_start = 0.0
        self._hold_until = 0.0
        self._measured = [0, 0]  # items, batches of the measurement: its mean batch size
        self._recent: deque[int] = deque(maxlen=2 * self.stretch)  # batch sizes while held

    def threads(self, now: float) -> int:
        """The count the next batch runs with; a held choice expires after hold_s."""
        if not self._measuring and now >= self._hold_until:
            self._begin()
        return self.current

    def record(self, items: int, started: float, ended: float) -> bool:
        """One batch of `items` real instances ran from `started` to `ended` (monotonic s) with
        `current` threads. True when this batch ended a measurement (`last` holds the verdict)."""
        if not self._measuring:
            self._watch(items, ended)
            return False
        self._measured[0] += items
        self._measured[1] += 1
        if self._stretch_batches == 0:
            self._stretch_start = started
        self._stretch_batches += 1
        self._stretch_items += items
        if self._stretch_batches < self.stretch:
            return False
        wall = ended - self._stretch_start
        if wall > 0:
            self._rates[self.current].append(self._stretch_items / wall)
        self._stretch_batches = self._stretch_items = 0
        self.current = self.low if self.current == self.high else self.high
        if min(len(r) for r in self._rates.values()) < self.rounds:
            return False
        self._decide(ended)
        return True

    def _watch(self, items: int, now: float) -> None:
        """While a choice is held: end the hold (the next `threads()` measures again) once the
        recent batches are a different load from the measured ones."""
        self._recent.append(items)
        if len(self._recent) < 2 * self.stretch:  # the deque's maxlen
            return
        recent = max(statistics.median(self._recent), 0.1)
        measured = max(self._measured[0] / self._measured[1], 0.1)
        if max(recent / measured, measured / recent) > self.regime:
            self._hold_until = now
            self.last = dict(self.last, ended_early=f"batch size {measured:.1f} -> {recent:.1f}")

    def _decide(self, now: float) -> None:
        high = statistics.median(self._rates[self.high])
        low = statistics.median(self._rates[self.low])
        before = self.chosen
        self.chosen = self.current = self.low if low > high * (1 + self.margin) else self.high
        self._measuring = False
        self._hold_until = now + self.hold_s
        self.last = {
            "threads": self.chosen,
            "changed": self.chosen != before,
            "items_per_s": {str(self.high): round(high, 1), str(self.low): round(low, 1)},
            "mean_batch": round(self._measured[0] / self._measured[1], 1),
        }


__all__ = ["ThreadTuner"]
