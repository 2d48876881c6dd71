"""Where the model's replicas run: the `device` and `devices` settings resolved on this machine.

Contract. `replica_places(config)` returns one `Place` per model replica, or raises ConfigError
naming the key, the value and what this machine allows (torchfleet_compat.problems' sentence):
- `device` picks the kind (auto: CUDA when torch sees a GPU, else CPU; cpu; cuda; cuda:N).
- `devices` picks the replicas of that kind:
  - CUDA: `auto` and `all` give one replica per visible GPU; a list names GPU indices
    ([0, 2]), one each; `device: cuda:N` is that one GPU (and wants `devices: auto`).
  - CPU: `auto` is one replica over every usable CPU, not pinned (the single-replica path, as
    before replicas existed); `all` is one replica per usable CPU; a list names CPU sets
    ([0, 1] is two replicas of one CPU, [[0, 1], [2, 3]] or "0-1,2-3" two of two CPUs), each
    within the process's affinity mask.
- A pinned replica's worker thread runs with that CPU set as its affinity and, unless
  `torch_threads` is set, one intra-op thread per CPU of its set; an unpinned CPU replica keeps
  the process's thread settings; a GPU replica of several gets an even share of the usable CPUs.
`label` names a replica in metrics (`device`), /v1/model and logs: cuda:0, cpu (unpinned),
cpu:1, cpu:0-1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch
from torchfleet_compat.problems import Problems

from .config import FIELDS, Config, ConfigError
from .cpus import usable_cpus
from .model import resolve_device


@dataclass(frozen=True)
class Place:
    device: torch.device
    cpus: tuple[int, ...] | None = None  # the pinned CPU set; None: not pinned
    threads: int | None = None  # intra-op threads of its worker; None: the process's setting

    @property
    def label(self) -> str:
        if self.device.type == "cuda":
            return f"cuda:{self.device.index or 0}"
        if self.cpus is None:
            return "cpu"
        lo, hi = self.cpus[0], self.cpus[-1]
        if len(self.cpus) == 1:
            return f"cpu:{lo}"
        if list(self.cpus) == list(range(lo, hi + 1)):
            return f"cpu:{lo}-{hi}"
        return "cpu:" + "+".join(map(str, self.cpus))

    def as_dict(self) -> dict[str, object]:
        return {
            "device": self.label,
            "cpus": None if self.cpus is None else list(self.cpus),
        }


def affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def replica_places(config: Config, cpus: Sequence[int] | None = None) -> list[Place]:
    """The replicas `config` asks for on this machine (module doc); `cpus`: the affinity mask
    (tests), else this process's."""
    kind = resolve_device(config.device)
    found = Problems()
    if kind.type == "cuda":
        places = _gpu_places(config, kind, found)
    else:
        places = _cpu_places(config, list(affinity() if cpus is None else cpus), found)
    found.raise_if_any(ConfigError)
    return places


def _gpu_places(config: Config, kind: torch.device, found: Problems) -> list[Place]:
    devices = config.devices
    count = torch.cuda.device_count()
    if kind.index is not None:
        if devices != "auto":
            found.add(
                "devices",
                devices,
                "auto while device names one GPU (cuda:N); for replicas set device: cuda",
            )
        return [Place(kind)]
    if devices in ("auto", "all"):
        indices = list(range(count))
    else:
        indices = []
        for ids in devices:
            if len(ids) != 1 or ids[0] >= count:
                found.add(
                    "devices",
                    _shown(devices),
                    f"GPU indices 0..{count - 1}, one per replica",
                    why=f"{count} CUDA device(s) are visible",
                )
                return []
            indices.append(ids[0])
    share = max(1, usable_cpus() // max(1, len(indices))) if len(indices) > 1 else None
    threads = config.torch_threads or share
    return [Place(torch.device("cuda", i), None, threads) for i in indices]


def _cpu_places(config: Config, mask: list[int], found: Problems) -> list[Place]:
    devices = config.devices
    if devices == "auto":
        return [Place(torch.device("cpu"))]
    if devices == "all":
        sets: list[tuple[int, ...]] = [(c,) for c in mask[: usable_cpus()]]
    else:
        sets = list(devices)
        outside = sorted({c for ids in sets for c in ids} - set(mask))
        if outside:
            found.add(
                "devices",
                _shown(devices),
                f"CPU sets within this process's CPUs {_ranges(mask)} ({FIELDS['devices'].allowed})",
                why=f"CPU {outside[0]} is not one of them",
            )
            return []
    return [Place(torch.device("cpu"), ids, config.torch_threads or len(ids)) for ids in sets]


def _shown(devices: object) -> object:
    """A replicas tuple as the user wrote it (lists), for the problem sentence."""
    if isinstance(devices, tuple):
        return [list(ids) if len(ids) > 1 else ids[0] for ids in devices]
    return devices


def _ranges(ids: Sequence[int]) -> str:
    return ",".join(map(str, ids)) if len(ids) <= 8 else f"{ids[0]}..{ids[-1]}"


def pin_current_thread(place: Place) -> None:
    """Run the calling thread (a replica's worker) where `place` says: its CPU set (Linux
    applies sched_setaffinity(0) to the calling thread; OpenMP threads it starts later inherit
    it), its intra-op thread count (OpenMP keeps it per thread) and its CUDA device (current per
    thread)."""
    if place.cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, place.cpus)
    if place.threads is not None:
        torch.set_num_threads(place.threads)
    if place.device.type == "cuda":
        torch.cuda.set_device(place.device)
