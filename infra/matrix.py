"""The version matrix (compat/matrix.yml) as infra needs it: GPU model -> compute capability and
which CUDA profiles can drive it. The matrix is the one place these facts live; this module only
reads it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MATRIX = REPO_ROOT / "compat" / "matrix.yml"


def _cc_tuple(value: str) -> tuple[int, int]:
    major, _, minor = str(value).partition(".")
    return int(major), int(minor or 0)


@dataclass(frozen=True)
class GpuModel:
    name: str
    compute_capability: str
    arch: str
    memory_gib: int


@dataclass(frozen=True)
class Matrix:
    default_profile: str
    profiles: dict[str, dict[str, Any]]
    gpus: dict[str, GpuModel]
    distros: dict[str, dict[str, Any]]
    min_free_disk_gb: int

    def gpu(self, model: str) -> GpuModel:
        return self.gpus[model]

    def can_drive(self, profile: str, compute_capability: str) -> bool:
        """A profile drives a GPU when its wheel reaches the GPU's capability."""
        limit = self.profiles[profile].get("max_compute_capability")
        if limit is None:  # the cpu profile drives no GPU
            return False
        return _cc_tuple(compute_capability) <= _cc_tuple(limit)

    def profiles_for(self, compute_capability: str) -> list[str]:
        return [p for p in self.profiles if self.can_drive(p, compute_capability)]


def matrix_path() -> Path:
    return Path(os.environ.get("TORCHFLEET_MATRIX", DEFAULT_MATRIX))


@lru_cache(maxsize=4)
def load_matrix(path: str | None = None) -> Matrix:
    raw = yaml.safe_load(Path(path or matrix_path()).read_text())
    gpus = {
        name: GpuModel(
            name=name,
            compute_capability=str(spec["compute_capability"]),
            arch=spec["arch"],
            memory_gib=int(spec["memory_gib"]),
        )
        for name, spec in raw["gpus"].items()
    }
    return Matrix(
        default_profile=raw["default_profile"],
        profiles=raw["profiles"],
        gpus=gpus,
        distros=raw["distros"],
        min_free_disk_gb=int(raw["min_free_disk_gb"]),
    )
