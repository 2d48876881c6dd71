"""The tracks of a `mode: kubernetes` stack: which model file each Deployment serves, switched
through the stack's `rollout` block and `up` (infra/rollout/cloud.py's `TrackModels`).

Contract. `KubernetesTracks(handle, up, volume)`:
- the candidate track is the candidate Deployment (infra/k8s/workload.candidate_deployment): its
  file is the block's `candidate_model`; while `candidate_weight` is 0 it has no pods and the
  track's requests are the stable's, so it serves the stable's file;
- the stable track is the stable Deployment: its file is the block's `stable_model`
  (workload.stable_model, default model.pt);
- `switch(track, model)` places the checked file in the model volume (`volume.put`: the store's
  `<sha256>.pt` and its sidecar), writes its name to the track's key with `set_config`, and runs
  `up` (the caller's `torchfleet up`, which waits for the Deployment's rollout); the stable track
  switched is the promotion, and the engine's equal weights then put candidate_weight back to 0.
- `serving(track)` is the track's file fetched from the volume (`volume.fetch`) and the
  model_version the runtime reports for it.

The model volume is the bucket under `model_bucket`/`kubernetes.model_prefix` that the pods
mount read-only: `S3Volume` on AWS; `FolderVolume` is a folder (the tests, or a bucket mounted
here). A stack whose model is baked into the image has no volume to place a candidate in.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from infra.config import RolloutSplit, StackConfig
from infra.rollout.cloud import KEY, StackHandle, block_of, write_block
from infra.rollout.ref import sha256_of

TRACK_KEYS = {"candidate": "candidate_model", "stable": "stable_model"}


class VolumeError(RuntimeError):
    """A model file that could not be placed in or read from the model volume."""


def runtime_version(model: Path) -> str:
    """The model_version the runtime reports for `model`: its sidecar's `version`, else
    "sha256:" + the file's first 12 hex digits (runtime/src/torchfleet_runtime/model.py,
    `_versioned` and `file_version`; that module needs torch, so the rule is restated here and
    tests/rollout/test_kubernetes_rollout.py checks the two agree)."""
    sidecar = model.with_suffix(".json")
    if sidecar.is_file():
        version = json.loads(sidecar.read_text()).get("version")
        if version not in (None, ""):
            return str(version)
    return "sha256:" + sha256_of(model)[:12]


class ModelVolume(Protocol):
    def fetch(self, name: str) -> Path:
        """A local copy of the volume's file `name` (with its sidecar when it has one)."""
        ...

    def put(self, model: Path) -> str:
        """`model` (and its sidecar, or none) in the volume under its own name; that name."""
        ...


class FolderVolume:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def fetch(self, name: str) -> Path:
        path = self.folder / name
        if not path.is_file():
            raise VolumeError(f"the model volume has no {name} (in {self.folder})")
        return path

    def put(self, model: Path) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        for src in (model, model.with_suffix(".json")):
            if src.is_file() and src.resolve() != (self.folder / src.name).resolve():
                shutil.copyfile(src, self.folder / src.name)
        return model.name


class S3Volume:
    """s3://bucket/prefix: what the EKS pods mount (the S3 CSI driver, infra/aws/cluster.py)."""

    def __init__(self, bucket: str, prefix: str, cache: Path, region: str, s3: Any = None) -> None:
        if s3 is None:
            import boto3

            s3 = boto3.client("s3", region_name=region)
        self.bucket, self.prefix, self.cache, self.s3 = bucket, prefix, cache, s3

    def _key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def fetch(self, name: str) -> Path:
        self.cache.mkdir(parents=True, exist_ok=True)
        local = self.cache / name
        try:
            self.s3.download_file(self.bucket, self._key(name), str(local))
        except Exception as err:
            raise VolumeError(f"s3://{self.bucket}/{self._key(name)}: {err}") from err
        sidecar = Path(name).with_suffix(".json").name
        try:
            self.s3.download_file(self.bucket, self._key(sidecar), str(self.cache / sidecar))
        except Exception:  # no sidecar: the runtime versions the file by its digest
            (self.cache / sidecar).unlink(missing_ok=True)
        return local

    def put(self, model: Path) -> str:
        try:
            for src in (model, model.with_suffix(".json")):
                if src.is_file():
                    self.s3.upload_file(str(src), self.bucket, self._key(src.name))
        except Exception as err:
            raise VolumeError(f"uploading {model.name} to s3://{self.bucket}: {err}") from err
        return model.name


def volume_of(cfg: StackConfig, cache: Path) -> ModelVolume:
    """The stack's model volume; VolumeError naming the key when it has none or it is not built."""
    k = cfg.kubernetes
    if k is None or not k.model_prefix or not cfg.model_bucket:
        raise VolumeError(
            "kubernetes.model_prefix is unset: the model is baked into the image, so there is no "
            "model volume to place a candidate in (set model_bucket and kubernetes.model_prefix)"
        )
    if cfg.cloud != "aws":
        raise VolumeError(
            f"placing a model file in the model volume is built for aws only, not {cfg.cloud} "
            "(OSS): nothing was changed"
        )
    return S3Volume(cfg.model_bucket, k.model_prefix, cache, cfg.region)


class KubernetesTracks:
    def __init__(
        self,
        handle: StackHandle,
        up: Callable[[], Any],
        volume: ModelVolume,
        say: Callable[[str], None] = print,
    ) -> None:
        self.handle, self.up, self.volume, self.say = handle, up, volume, say

    def file_of(self, track: str) -> str:
        block = block_of(self.handle)
        stable = str(block.get("stable_model", RolloutSplit.stable_model))
        if track == "stable" or not block.get("candidate_weight"):
            return stable  # no candidate pods: the track's requests are the stable's
        return str(block.get("candidate_model", RolloutSplit.candidate_model))

    def serving(self, track: str) -> tuple[Path, str]:
        path = self.volume.fetch(self.file_of(track))
        return path, runtime_version(path)

    def switch(self, track: str, model: Path) -> str:
        name = self.volume.put(model)
        block = block_of(self.handle)
        key = TRACK_KEYS[track]
        if block.get(key) != name:
            block[key] = name
            write_block(self.handle, block)
            self.say(f"  stack config {KEY}.{key} = {name}: `up` rolls the {track} Deployment")
            self.up()
        return runtime_version(model)
