"""An immutable model reference, checked before anything moves, and the stack's model store.

Contract. A reference is `LOCATION@sha256:<64 hex>`: LOCATION a file path (the local fleet's
bucket is a folder) or, later, a bucket key; the digest is the whole file's SHA-256. `ModelRef.parse`
names what is wrong with a malformed one. `Store(folder).put(ref)` reads the file once, checks
its digest and keeps the bytes under `<folder>/<sha256>.pt` (with its sidecar `.json` when there
is one beside it), so what the nodes receive is what was checked, whatever happens to LOCATION
later; `Store.file(sha256)` is the kept copy. A digest that does not match fails before any node
or weight changes, naming both digests.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from torchfleet_compat.problems import sentence

from infra.bootstrap.torchfleet_agent.boot import sha256_file
from infra.rollout.errors import RolloutError

_REF = re.compile(r"(?P<location>.+)@sha256:(?P<sha>[0-9a-f]{64})")


class RefError(RolloutError, ValueError):
    """A model reference that is malformed, unreadable or not what its digest says."""


@dataclass(frozen=True)
class ModelRef:
    location: str
    sha256: str

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        m = _REF.fullmatch(text.strip())
        if m is None:
            raise RefError(
                sentence("--model", text, "LOCATION@sha256:<64 lowercase hex> (sha256sum FILE)")
            )
        return cls(m.group("location"), m.group("sha"))

    def __str__(self) -> str:
        return f"{self.location}@sha256:{self.sha256}"


def sha256_of(path: Path) -> str:
    return sha256_file(str(path))


class Store:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def file(self, sha: str) -> Path:
        return self.folder / f"{sha}.pt"

    def put(self, ref: ModelRef) -> Path:
        """Copy the referenced file in, checking its digest on the copy; the kept path."""
        src = Path(ref.location)
        kept = self.file(ref.sha256)
        if kept.is_file() and sha256_of(kept) == ref.sha256:
            return kept
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_suffix(".tmp")
        try:
            shutil.copyfile(src, tmp)
        except OSError as exc:
            raise RefError(f"model {ref}: cannot read {src} ({exc.strerror})") from None
        got = sha256_of(tmp)
        if got != ref.sha256:
            tmp.unlink()
            raise RefError(
                f"model {ref}: {src} has sha256 {got}, not {ref.sha256}; nothing was changed"
            )
        sidecar = src.with_suffix(".json")
        if sidecar.is_file():
            shutil.copyfile(sidecar, kept.with_suffix(".json"))
        os.replace(tmp, kept)
        return kept
