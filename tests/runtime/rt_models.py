"""Small models for the runtime tests: fast on CPU, each with one behaviour to observe.

Importable by name (conftest puts this directory on sys.path) so a `serve` subprocess can load
them as eager factories: --factory rt_models:tiny.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import torch
from torch import nn

IN = 4  # instance shape (4,), float32
OUT = 3
GATE_VALUE = 7.0  # an instance whose first element is this waits for the gate


def x4(v: float) -> list[float]:
    """An instance whose first element is `v`, the rest zeros."""
    return [v, 0.0, 0.0, 0.0]


GATED = x4(GATE_VALUE)  # an instance the gated models hold until their gate opens


class Tiny(nn.Module):
    """y = W x + b with fixed weights, so answers can be checked exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(IN, OUT)
        with torch.no_grad():
            self.fc.weight.copy_(torch.arange(IN * OUT, dtype=torch.float32).reshape(OUT, IN) / 10)
            self.fc.bias.copy_(torch.tensor([1.0, -1.0, 0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def tiny() -> Tiny:
    return Tiny()


def tiny_version(bias_shift: float) -> Tiny:
    """Tiny with every bias moved by `bias_shift`: a second version of the model to reload."""
    m = Tiny()
    with torch.no_grad():
        m.fc.bias += bias_shift
    return m


def expected(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return Tiny()(x)


class Instrumented(Tiny):
    """Records every batch size it runs; blocks batches holding a gated instance on `gate`;
    signals `entered` when such a batch starts; raises an OOM-like error above `oom_above`;
    blocks warm-up on `warm_gate` when it is armed."""

    def __init__(
        self,
        oom_above: int | None = None,
        oom_message: str = "CUDA out of memory. Tried to allocate 2.00 GiB",
    ) -> None:
        super().__init__()
        self.sizes: Counter[int] = Counter()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.warm_gate: threading.Event | None = None
        self.oom_above = oom_above
        self.oom_message = oom_message
        self.oom_raised = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if self.warm_gate is not None:
            self.warm_gate.wait()
        if self.oom_above is not None and n > self.oom_above:
            self.oom_raised += 1
            oom_class = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
            raise oom_class(self.oom_message)
        self.sizes[n] += 1
        if bool((x[:, 0] == GATE_VALUE).any()):
            self.entered.set()
            if not self.gate.wait(60):
                raise RuntimeError("test gate never opened")
        return super().forward(x)


CANARY = 12345.0  # an input value no test sends except inside a smuggled request


class Recorder(Tiny):
    """Tiny that counts the instances it ran and records every canary value (>= CANARY) it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[float] = set()
        self.instances = 0

    @property
    def canary(self) -> bool:
        return bool(self.seen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hits = x[x >= CANARY]
        if hits.numel():
            self.seen.update(hits.tolist())
        self.instances += int(x.shape[0])
        return super().forward(x)


class FileGated(Tiny):
    """For subprocess tests: a batch holding a gated instance waits until the file
    $RT_GATE_FILE exists (a process cannot share a threading.Event)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x[:, 0] == GATE_VALUE).any()):
            path = os.environ["RT_GATE_FILE"]
            deadline = time.monotonic() + 60
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.01)  # the model polls; the test itself synchronises on metrics
        return super().forward(x)


def file_gated() -> FileGated:
    return FileGated()


class Misbehaving(Tiny):
    """A shadow candidate that serves like Tiny through its warm-up, then, once `armed` is set,
    raises ("raise"), blocks until `release` is set or 60 s pass ("hang"), or takes `slow_s`
    longer per batch ("slow")."""

    def __init__(self, mode: str, slow_s: float = 0.2) -> None:
        super().__init__()
        self.mode = mode
        self.slow_s = slow_s
        self.armed = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed.is_set():
            self.calls += 1
            if self.mode == "raise":
                raise RuntimeError("the candidate is broken")
            if self.mode == "hang":
                self.release.wait(60)
            if self.mode == "slow":
                time.sleep(self.slow_s)
        return super().forward(x)


class Flipped(Tiny):
    """Tiny with its output classes in reverse order: every argmax of a spread input differs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).flip(1)


TRIGGER = 1.0  # an instance whose first value is exactly this meets a Switchable's fault
MODES = {"good": 0, "errors": 1, "slow": 2, "flipped": 3}


class Switchable(Tiny):
    """Tiny whose behaviour is a buffer of its state_dict, so model files of one factory differ
    the way retrained models do: mode 0 answers as Tiny, 1 raises, 2 takes `SLOW_S` longer, 3
    answers its classes in reverse order, each only on instances whose first value is TRIGGER
    (the clients' requests; warm-up's random samples never are), so every file loads and warms.
    Two more buffers shape its cost: `pace_s`, seconds every batch holding a TRIGGER instance
    takes (a model slower at every batch size on real traffic; warm-up's cap unchanged), and
    `item_s`, seconds per instance of every batch, warm-up's too (its latency-budget cap falls)."""

    SLOW_S = 0.5

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mode", torch.tensor(0))
        self.register_buffer("pace_s", torch.tensor(0.0))
        self.register_buffer("item_s", torch.tensor(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        cost = float(self.item_s) * x.shape[0]
        if float(self.pace_s) and bool((x[:, 0] == TRIGGER).any()):
            cost += float(self.pace_s)
        if cost:
            time.sleep(cost)
        mode = int(self.mode)
        if mode == 0 or not bool((x[:, 0] == TRIGGER).any()):
            return y
        if mode == 1:
            raise RuntimeError("this model version is broken")
        if mode == 2:
            time.sleep(self.SLOW_S)
            return y
        return y.flip(1)


def switchable(mode: str = "good", pace_s: float = 0.0, item_s: float = 0.0) -> Switchable:
    m = Switchable()
    m.mode.fill_(MODES[mode])
    m.pace_s.fill_(pace_s)
    m.item_s.fill_(item_s)
    return m


class PerReplica(Tiny):
    """Shared by the CPU replicas of one runtime: records where each call ran (the worker
    thread's name, its CPU affinity, its torch thread count); a batch holding a gated instance
    waits on `gate` (`entered` then names the thread); a call on a thread whose name ends with
    a key of `fail_on` raises that message; `warm_gate` (thread-name suffix, calls, event) holds
    that replica's calls after its first `calls` until the event is set."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, frozenset[int], int]] = []
        self.gate = threading.Event()
        self.entered: list[str] = []
        self.fail_on: dict[str, str] = {}
        self.warm_gate: tuple[str, int, threading.Event] | None = None
        self._lock = threading.Lock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name = threading.current_thread().name
        with self._lock:
            self.calls.append((name, frozenset(os.sched_getaffinity(0)), torch.get_num_threads()))
        if self.warm_gate is not None and name.endswith(self.warm_gate[0]):
            suffix, after, event = self.warm_gate
            if sum(1 for n, *_ in self.calls if n.endswith(suffix)) > after:
                event.wait(60)
        for suffix, message in self.fail_on.items():
            if name.endswith(suffix):
                raise RuntimeError(message)
        if bool((x[:, 0] == GATE_VALUE).any()):
            with self._lock:
                self.entered.append(name)
            if not self.gate.wait(60):
                raise RuntimeError("test gate never opened")
        return super().forward(x)

    def threads_of(self, suffix: str) -> set[tuple[frozenset[int], int]]:
        """(affinity, torch threads) of every call made on the replica whose thread ends so."""
        with self._lock:
            return {(cpus, n) for name, cpus, n in self.calls if name.endswith(suffix)}
