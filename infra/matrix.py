"""Where infra finds the version matrix, loaded once per process.

The schema and every compatibility rule live in `torchfleet_compat.matrix` (the stdlib-only
package the preflight module and `torchfleet-runtime check` judge nodes with; `make setup`
installs it editable in the controller's virtualenv). This module only says which file infra
reads: $TORCHFLEET_MATRIX, else the repository's compat/matrix.yml.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from torchfleet_compat.matrix import GpuModel, Matrix, MatrixError, Profile, read

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
