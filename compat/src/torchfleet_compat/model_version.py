"""The version a runtime reports for its model (`X-Model-Version`, the `model_version` label of
its metrics, `GET /v1/model`), as one rule for the runtime that reports it and for the rollout on
the controller that must know it before any node loads the file (infra/rollout/tracks.py):

- the version the model's metadata declares (the sidecar `MODEL.json`'s "version"), else
- "sha256:" + the first 12 hex digits of the model file's SHA-256, else
- "module" (no file: a module handed to the runtime by code).

Standard library only, Python 3.8 (the node's interpreter and the controller's)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Union

PathLike = Union[str, Path]
BLOCK = 1 << 20  # read in 1 MiB blocks: a model file may be gigabytes


def file_version(path: PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()[:12]


def model_version(declared: str, model: PathLike | None) -> str:
    """The reported version: `declared` (the metadata's) if set, else the file's, else "module"."""
    if declared:
        return declared
    if model and Path(model).is_file():
        return file_version(model)
    return "module"


def sidecar_version(model: Path) -> str:
    """The version the model's sidecar (`MODEL.json` beside `MODEL.pt`) declares, or ""."""
    sidecar = model.with_suffix(".json")
    if not sidecar.is_file():
        return ""
    version = json.loads(sidecar.read_text()).get("version")
    return "" if version is None else str(version)
