"""Where infra finds the version matrix, loaded once per process.

The schema and every compatibility rule live in `torchfleet_runtime.matrix` (one stdlib-only
module that the preflight probe and `torchfleet-runtime check` import too; the runtime is
installed editable in the controller's virtualenv by `make setup`). This module only says which
file infra reads: $TORCHFLEET_MATRIX, else the repository's compat/matrix.yml.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from torchfleet_runtime.matrix import GpuModel, Matrix, MatrixError, Profile, read

__all__ = [
    "DEFAULT_MATRIX",
    "REPO_ROOT",
    "GpuModel",
    "Matrix",
    "MatrixError",
    "Profile",
    "load_matrix",
    "matrix_path",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MATRIX = REPO_ROOT / "compat" / "matrix.yml"


def matrix_path() -> Path:
    return Path(os.environ.get("TORCHFLEET_MATRIX", DEFAULT_MATRIX))


@lru_cache(maxsize=4)
def load_matrix(path: str | None = None) -> Matrix:
    """The validated matrix (MatrixError names the file, key, value and what is allowed)."""
    return read(str(path or matrix_path()))
