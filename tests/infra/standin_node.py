"""A stand-in for fleet-node's `infra.bundle` and `infra.bootstrap` (CONTRACT-fleet.md), used by
these tests only while this branch does not carry the real modules. `install()` is a no-op once
infra/bundle.py and infra/bootstrap/ exist: the tests then run against the real ones.

It keeps the contract's observable promises the infra tests rely on: a reproducible .tar.gz
whose sha256 is the digest of its bytes, the key `bundles/<stack>/<sha256>.tar.gz`, and a
deterministic `#cloud-config` document that carries the spec (so the bundle checksum) inside.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
import tempfile
import types
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def real_modules_present() -> bool:
    return (REPO / "infra" / "bundle.py").exists() and (REPO / "infra" / "bootstrap").is_dir()


@dataclass(frozen=True)
class Bundle:
    path: Path
    sha256: str
    key: str
    version: str


def build(stack: str, dest: Path | None = None) -> Bundle:
    members = [REPO / "compat" / "matrix.yml", *sorted(
        (REPO / "inventories" / stack / "group_vars").glob("*.yml"))]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path in members:
            data = path.read_bytes()
            info = tarfile.TarInfo(str(path.relative_to(REPO)))
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    blob = gzip.compress(raw.getvalue(), mtime=0)
    sha = hashlib.sha256(blob).hexdigest()
    folder = dest or Path(tempfile.gettempdir()) / "torchfleet-standin-bundles"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stack}-{sha[:12]}.tar.gz"
    path.write_bytes(blob)
    return Bundle(path=path, sha256=sha, key=f"bundles/{stack}/{sha}.tar.gz",
                  version=f"standin-{sha[:12]}")


@dataclass(frozen=True)
class BootstrapSpec:
    cloud: str
    region: str
    stack: str
    bundle_bucket: str
    bundle_key: str
    bundle_sha256: str
    mode: str = "cold"
    group_name: str | None = None
    launch_hook: str | None = None
    terminate_hook: str | None = None
    service_port: int = 8080
    metrics_namespace: str = "torchfleet"
    endpoints: Mapping[str, str] = field(default_factory=dict)
    group_id: str | None = None
    metrics_group_id: str | None = None
    poweroff: bool = True


def render_user_data(spec: BootstrapSpec) -> str:
    assert spec.mode in ("cold", "baked", "bake"), spec.mode
    doc = {"write_files": [{"path": "/etc/torchfleet/bootstrap.json", "permissions": "0600",
                            "content": json.dumps(asdict(spec), sort_keys=True, default=dict)}],
           "runcmd": [["systemctl", "start", "--no-block", "torchfleet-bootstrap.service"]]}
    text = "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=True)
    assert len(text.encode()) <= 16 * 1024
    return text


def install() -> None:
    if real_modules_present() or "infra.bundle" in sys.modules:
        return
    bundle = types.ModuleType("infra.bundle")
    bundle.Bundle, bundle.build = Bundle, build
    bootstrap = types.ModuleType("infra.bootstrap")
    bootstrap.BootstrapSpec, bootstrap.render_user_data = BootstrapSpec, render_user_data
    sys.modules["infra.bundle"], sys.modules["infra.bootstrap"] = bundle, bootstrap
