"""The online choice of torch's intra-op thread count (threadtune.py): the decision logic with
made-up batch timings, then the batcher running a real model with the counts it asks for."""

from __future__ import annotations

import threading

import pytest
import rt_models
import torch
from rt_helpers import wait_until
from torchfleet_runtime.batcher import Batcher
from torchfleet_runtime.model import Predictor
from torchfleet_runtime.threadtune import ThreadTuner


def feed(tuner: ThreadTuner, now: float, seconds_per_item: dict[int, float], items: int = 8):
    """One batch of `items` with the count the tuner asks for; returns (now, ended measurement)."""
    k = tuner.threads(now)
    took = items * seconds_per_item[k]
    return now + took, tuner.record(items, now, now + took)


def run_measurement(tuner: ThreadTuner, now: float, seconds_per_item: dict[int, float]):
    counts = []
    while True:
        counts.append(tuner.threads(now))
        now, ended = feed(tuner, now, seconds_per_item)
        if ended:
            return now, counts


def test_one_thread_fewer_is_kept_only_when_it_serves_more_and_the_choice_is_held():
    tuner = ThreadTuner(2, stretch=3, rounds=2, margin=0.04, hold_s=60)
    now, counts = run_measurement(tuner, 0.0, {2: 0.010, 1: 0.008})  # one thread: 25 % more
    # interleaved stretches, starting with one per CPU: 2 2 2 1 1 1 2 2 2 1 1 1
    assert counts == [2, 2, 2, 1, 1, 1] * 2
    assert tuner.chosen == 1 and tuner.last["changed"] is True
    assert tuner.last["items_per_s"] == {"2": 100.0, "1": 125.0}  # JSON keys: the model card
    # held: the load may change, but nothing is measured for hold_s
    for _ in range(20):
        assert tuner.threads(now) == 1
        now, ended = feed(tuner, now, {2: 0.010, 1: 0.008})
        assert not ended
    # after hold_s a new measurement starts at one per CPU; a load where both serve the same
    # (arrival-bound) goes back to one thread per CPU
    now = now + 60
    assert tuner.threads(now) == 2
    now, _ = run_measurement(tuner, now, {2: 0.010, 1: 0.0099})
    assert tuner.chosen == 2 and tuner.last["changed"] is True


def test_a_different_load_ends_the_hold_early_and_a_steady_one_does_not():
    """Measured under one client (batches of 1), then 32 clients arrive (batches of 8): the
    choice made for single requests must not hold for two minutes of full batches."""
    tuner = ThreadTuner(2, stretch=3, rounds=2, hold_s=120, regime=1.5)
    now = 0.0
    while True:
        now, ended = feed(tuner, now, {2: 0.010, 1: 0.012}, items=1)
        if ended:
            break
    assert tuner.chosen == 2 and tuner.last["mean_batch"] == 1.0
    # the same load for longer than the window, one burst included: held
    for items in [1] * 8 + [8] + [1] * 4:
        now, _ = feed(tuner, now, {2: 0.010, 1: 0.012}, items=items)
    assert tuner.threads(now) == 2 and not tuner._measuring and "ended_early" not in tuner.last
    # full batches: once they are most of the window (2 * stretch batches) a measurement starts
    fed = 0
    while not tuner._measuring:
        now, _ = feed(tuner, now, {2: 0.010, 1: 0.008}, items=8)
        fed += 1
        tuner.threads(now)
        assert fed <= 6
    assert fed >= 3
    assert tuner.last["ended_early"] == "batch size 1.0 -> 4.5"
    now, counts = run_measurement(tuner, now, {2: 0.010, 1: 0.008})
    assert counts == [2, 2, 2, 1, 1, 1] * 2
    assert tuner.chosen == 1 and tuner.last["mean_batch"] == 8.0


def test_within_the_margin_one_thread_per_cpu_stays():
    tuner = ThreadTuner(4, stretch=2, rounds=3, margin=0.04)
    run_measurement(tuner, 0.0, {4: 0.010, 3: 0.0098})  # 2 % more with three: noise
    assert tuner.chosen == 4 and tuner.last["changed"] is False


def test_a_single_cpu_has_nothing_to_choose():
    with pytest.raises(ValueError, match="at least 2"):
        ThreadTuner(1)


class ThreadCounting(rt_models.Tiny):
    """Records torch's intra-op thread count in the thread that runs each batch."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return super().forward(x)


def test_the_batcher_runs_each_batch_with_the_count_the_tuner_asks_for():
    model = ThreadCounting().eval()
    pred = Predictor(model, torch.device("cpu"), None)
    tuner = ThreadTuner(2, stretch=2, rounds=2, hold_s=3600)
    b = Batcher(pred, [1], 0.0, 64, thread_tuner=tuner)
    outside = torch.get_num_threads()
    b.start()
    try:
        for i in range(10):
            b.submit(torch.full((1, 4), float(i))).result(10)
        wait_until(lambda: len(model.seen) == 10, "10 batches")
    finally:
        b.close(10)
    # stretches of 2 alternate 2 and 1 until the measurement ends, then the choice is held
    assert model.seen[:8] == [2, 2, 1, 1, 2, 2, 1, 1]
    assert set(model.seen[8:]) == {tuner.chosen} and b.threads == tuner.chosen
    assert tuner.last["threads"] == tuner.chosen
    # set in the worker's own thread: this thread's count is untouched
    assert torch.get_num_threads() == outside
    assert threading.current_thread() is threading.main_thread()
