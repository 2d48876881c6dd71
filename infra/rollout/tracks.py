"""The tracks of a cloud stack: which model file each track serves, switched through the
stack's `rollout` block and `up` (infra/rollout/cloud.py's `TrackModels`). One rule for both
shapes of a cloud fleet:
- mode: kubernetes: the tracks are the stable and candidate Deployments (infra/k8s/workload.py),
  the files in the model volume the pods mount (`model_bucket`/`kubernetes.model_prefix`);
- mode: group (AWS): the tracks are the stable Auto Scaling group (with its on-demand fallback)
  and the rollout's candidate group (infra/aws/fleet.py), the files in `model_bucket` under
  models/ (infra.nodeboot.MODEL_PREFIX), named by their digest (`<sha256>.pt`), which the
  nodes download and verify through their node config's model override; on Alibaba the same
  with the stable and candidate ESS groups in one VServer group and the files in OSS
  (infra/alicloud/fleet.py).

Contract. `ModelTracks(handle, up, volume, stable_default=...)`:
- the candidate track's file is the block's `candidate_model`; while `candidate_weight` is 0 it
  has no pods or nodes and the track's requests are the stable's, so it serves the stable's file;
- the stable track's file is the block's `stable_model`; without one, `stable_default`: a name
  in the volume (kubernetes: model.pt), or a callable giving a local copy of what the stable
  nodes serve without an override (group mode: the bundle's model, `bundle_model`);
- `switch(track, model)` places the checked file in the volume (`volume.put`: the store's
  `<sha256>.pt` and, kubernetes only, its sidecar), writes its name to the track's key with
  `set_config`, and runs `up` (the caller's `torchfleet up`: the Deployment's rollout, or the
  group's creation or instance refresh); the stable track switched is the promotion, and the
  engine's equal weights then put candidate_weight back to 0 (no candidate pods or group).
  Group mode's `refresh` (infra/rollout/refresh.py) then brings the promotion to the running
  stable nodes before switch returns; when they do not all get there, the stable track goes
  back to its file before (`up`, and the roll again) and switch raises RefreshError, which
  the engine answers with a rollback (guard `load`).
- `serving(track)` is the track's file fetched from the volume (`volume.fetch`) and the
  model_version the runtime reports for it; `version(track)` that version alone, fetched once
  per file (a window's figures ask it each window: CloudWatchSource).

`S3Volume` is s3://bucket/prefix (AWS), `OssVolume` oss://bucket/prefix (an Alibaba group
stack's models/, alibabacloud_oss_v2), both an `ObjectVolume`; `FolderVolume` a folder (the
tests, or a bucket mounted here). A kubernetes stack whose model is baked into the image has no
volume to place a candidate in, and the ACK pods' OSS mount is not built: `volume_of` refuses
both, naming why.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from torchfleet_compat.model_version import model_version, sidecar_version

from infra import bundle
from infra.config import RolloutSplit, StackConfig
from infra.nodeboot import MODEL_PREFIX
from infra.rollout.cloud import KEY, StackHandle, block_of, write_block
from infra.rollout.errors import RolloutError
from infra.rollout.ref import sha256_of
from infra.rollout.refresh import Refresh, RefreshError

TRACK_KEYS = {"candidate": "candidate_model", "stable": "stable_model"}


class VolumeError(RolloutError):
    """A model file that could not be placed in or read from the model volume."""


def runtime_version(model: Path) -> str:
    """The model_version a runtime will report for `model` (torchfleet_compat.model_version)."""
    return model_version(sidecar_version(model), model)


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


class ObjectVolume:
    """A bucket under a prefix as the model volume: `<scheme>://bucket/prefix`. The one rule for
    both clouds' object stores (a file and its sidecar under the prefix, a missing sidecar is
    none); S3Volume and OssVolume give the download and the upload."""

    scheme = ""

    def __init__(self, bucket: str, prefix: str, cache: Path) -> None:
        self.bucket, self.prefix, self.cache = bucket, prefix, cache

    def _key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def _download(self, key: str, dest: Path) -> None:
        raise NotImplementedError

    def _upload(self, src: Path, key: str) -> None:
        raise NotImplementedError

    def fetch(self, name: str) -> Path:
        self.cache.mkdir(parents=True, exist_ok=True)
        local = self.cache / name
        try:
            self._download(self._key(name), local)
        except Exception as err:
            raise VolumeError(f"{self.scheme}://{self.bucket}/{self._key(name)}: {err}") from err
        sidecar = Path(name).with_suffix(".json").name
        try:
            self._download(self._key(sidecar), self.cache / sidecar)
        except Exception:  # no sidecar: the runtime versions the file by its digest
            (self.cache / sidecar).unlink(missing_ok=True)
        return local

    def put(self, model: Path) -> str:
        try:
            for src in (model, model.with_suffix(".json")):
                if src.is_file():
                    self._upload(src, self._key(src.name))
        except Exception as err:
            raise VolumeError(
                f"uploading {model.name} to {self.scheme}://{self.bucket}: {err}"
            ) from err
        return model.name


class S3Volume(ObjectVolume):
    """s3://bucket/prefix: what the EKS pods mount (the S3 CSI driver, infra/aws/cluster.py), or
    an AWS group stack's models/ (the nodes download from it)."""

    scheme = "s3"

    def __init__(self, bucket: str, prefix: str, cache: Path, region: str, s3: Any = None) -> None:
        super().__init__(bucket, prefix, cache)
        if s3 is None:
            import boto3

            s3 = boto3.client("s3", region_name=region)
        self.s3 = s3

    def _download(self, key: str, dest: Path) -> None:
        self.s3.download_file(self.bucket, key, str(dest))

    def _upload(self, src: Path, key: str) -> None:
        self.s3.upload_file(str(src), self.bucket, key)


def oss_client(region: str, endpoint: str | None = None) -> Any:
    """An alibabacloud_oss_v2 client (V4 signatures) with this machine's Alibaba keys (the ones
    the Pulumi provider reads: infra.credentials.alicloud_keys), read when a call first needs
    them; the region's public endpoint unless `endpoint` (a URL) or ALICLOUD_OSS_ENDPOINT
    overrides it (as ALICLOUD_ESS_ENDPOINT does ESS's: refresh.py). The node agent builds its
    own from its RAM role (torchfleet_agent/boot.py's oss_client)."""
    import os

    import alibabacloud_oss_v2 as oss

    from infra.credentials import ALI_FIX, alicloud_keys

    def current() -> oss.credentials.Credentials:
        keys = alicloud_keys(os.environ, Path.home())
        if keys is None:
            raise VolumeError(f"no Alibaba Cloud credentials to reach OSS: {ALI_FIX}")
        return oss.credentials.Credentials(
            keys.access_key_id, keys.access_key_secret, keys.security_token
        )

    config = oss.config.load_default()
    config.credentials_provider = oss.credentials.CredentialsProviderFunc(current)
    config.region = region
    endpoint = endpoint or os.environ.get("ALICLOUD_OSS_ENDPOINT")
    if endpoint:
        config.endpoint = endpoint
    return oss.Client(config)


class OssVolume(ObjectVolume):
    """oss://bucket/prefix: an Alibaba group stack's models/ (the nodes download from it with
    their RAM role, torchfleet_agent/boot.py's fetch_object)."""

    scheme = "oss"

    def __init__(
        self, bucket: str, prefix: str, cache: Path, region: str, client: Any = None
    ) -> None:
        super().__init__(bucket, prefix, cache)
        self.client = client if client is not None else oss_client(region)

    def _download(self, key: str, dest: Path) -> None:
        import alibabacloud_oss_v2 as oss

        self.client.get_object_to_file(oss.GetObjectRequest(bucket=self.bucket, key=key), str(dest))

    def _upload(self, src: Path, key: str) -> None:
        import alibabacloud_oss_v2 as oss

        self.client.put_object_from_file(
            oss.PutObjectRequest(bucket=self.bucket, key=key), str(src)
        )


def volume_of(cfg: StackConfig, cache: Path) -> ModelVolume:
    """The stack's model volume; VolumeError naming the key when it has none or it is not built."""
    if cfg.mode == "kubernetes":
        k = cfg.kubernetes
        if k is None or not k.model_prefix or not cfg.model_bucket:
            raise VolumeError(
                "kubernetes.model_prefix is unset: the model is baked into the image, so there "
                "is no model volume to place a candidate in (set model_bucket and "
                "kubernetes.model_prefix)"
            )
        prefix = k.model_prefix
    else:
        if not cfg.model_bucket:
            raise VolumeError(
                "model_bucket is unset: a group stack's candidate is placed there (under "
                f"{MODEL_PREFIX}) for its nodes to download; set model_bucket"
            )
        prefix = MODEL_PREFIX
    return object_volume(
        "s3" if cfg.cloud == "aws" else "oss", cfg.model_bucket, prefix, cache, cfg.region
    )


def object_volume(scheme: str, bucket: str, prefix: str, cache: Path, region: str) -> ObjectVolume:
    """The bucket of an s3:// or oss:// location as a volume."""
    kind = S3Volume if scheme == "s3" else OssVolume
    return kind(bucket, prefix, cache, region)


def bundle_model(stack: str, cache: Path, region: str) -> Callable[[], Path]:
    """Group mode's stable file without `rollout.stable_model`: the model the stack's group vars
    name (infra.bundle.stack_model), fetched from S3 or OSS and checked against its checksum."""

    def fetch() -> Path:
        ref = bundle.stack_model(stack)
        source, checksum = ref.get("model_source", "demo"), ref.get("model_checksum", "")
        m = re.fullmatch(r"(s3|oss)://([^/]+)/(.*/)?([^/]+)", source)
        if m is None or not re.fullmatch(r"sha256:[0-9a-f]{64}", checksum):
            raise VolumeError(
                f"rollout.stable_model is unset and inventories/{stack}/group_vars names "
                f"inference_runtime_model_source {source!r} (checksum {checksum or 'none'}): the "
                "stable nodes' file cannot be read here. Set rollout.stable_model to "
                "<sha256>.pt of the stable model placed in model_bucket under "
                f"{MODEL_PREFIX}, or the group vars to s3:// (oss://) BUCKET/KEY with a sha256: "
                "checksum"
            )
        scheme, bucket, prefix, name = m.groups()
        path = object_volume(scheme, bucket, prefix or "", cache, region).fetch(name)
        got = sha256_of(path)
        if "sha256:" + got != checksum:
            raise VolumeError(f"{source} has sha256 {got}, not the group vars' {checksum}")
        return path

    return fetch


class ModelTracks:
    def __init__(
        self,
        handle: StackHandle,
        up: Callable[[], Any],
        volume: ModelVolume,
        say: Callable[[str], None] = print,
        stable_default: str | Callable[[], Path] = RolloutSplit.stable_model,
        refresh: Refresh | None = None,
    ) -> None:
        self.handle, self.up, self.volume, self.say = handle, up, volume, say
        self.stable_default = stable_default
        self.refresh = refresh
        # group mode (a callable default): the nodes get the .pt alone, named by its digest
        self.sidecars = isinstance(stable_default, str)
        self._versions: dict[str | None, str] = {}  # file_of -> its model_version

    def file_of(self, track: str) -> str | None:
        """The track's file in the volume; None: the stable nodes' own (stable_default)."""
        block = block_of(self.handle)
        default = self.stable_default if isinstance(self.stable_default, str) else None
        stable = block.get("stable_model", default)
        if track == "stable" or not block.get("candidate_weight"):
            return None if stable is None else str(stable)  # no candidate: the stable's requests
        return str(block.get("candidate_model", RolloutSplit.candidate_model))

    def serving(self, track: str) -> tuple[Path, str]:
        name = self.file_of(track)
        if name is None:
            assert callable(self.stable_default)
            path = self.stable_default()
        else:
            path = self.volume.fetch(name)
        self._versions[name] = runtime_version(path)
        return path, self._versions[name]

    def version(self, track: str) -> str:
        """The model_version `track` serves; its file is fetched only the first time (a file the
        rollout placed is named by its digest, so a name keeps its version)."""
        name = self.file_of(track)
        return self._versions[name] if name in self._versions else self.serving(track)[1]

    def switch(self, track: str, model: Path) -> str:
        if not self.sidecars and model.with_suffix(".json").is_file():
            raise VolumeError(
                f"{model.name} has a sidecar ({model.with_suffix('.json').name}): a group "
                "stack's nodes get the model file alone (the metadata stays the group vars' "
                "inference_runtime_metadata_source), so the runtime would not report the "
                "sidecar's version; roll out the .pt without it (its version: sha256:<12 hex>)"
            )
        name = self.volume.put(model)
        block = block_of(self.handle)
        key = TRACK_KEYS[track]
        if block.get(key) != name:
            before = block.get(key)
            since = self._place(block, key, name, track)
            if track == "stable" and self.refresh is not None:
                self._roll(key, before, since)
        return runtime_version(model)

    def shadow(self, model: Path | None) -> str | None:
        """Start (a file) or end (None) a shadow test on the stable track: the file placed in
        the volume, its name in the block's shadow_model, `up` (the stable Deployment's rolling
        update: each new pod loads it beside its model); the version it will report."""
        if not self.sidecars:
            raise VolumeError(
                "a shadow test on a group stack would replace every node to start it and again "
                "to end it: run it on the local fleet or a kubernetes stack"
            )
        name = None if model is None else self.volume.put(model)
        block = block_of(self.handle)
        if block.get("shadow_model") != name:
            self._place(block, "shadow_model", name, "stable")
        return None if model is None else runtime_version(model)

    def _place(self, block: dict[str, Any], key: str, name: str | None, track: str) -> float:
        """`block` (the stack's, as just read) with the track's key set to `name` (None:
        removed), written, and `up`; when `up` started."""
        if name is None:
            block.pop(key, None)
        else:
            block[key] = name
        write_block(self.handle, block)
        self.say(f"  stack config {KEY}.{key} = {name}: `up` rolls the {track} track")
        since = time.time()
        self.up()
        return since

    def _roll(self, key: str, before: str | None, since: float) -> None:
        """The promotion on the running stable nodes (refresh.py). When they do not all reach
        it, the stable track goes back to `before` and its nodes are rolled back onto that, so
        it serves one version; the error says both."""
        assert self.refresh is not None
        try:
            self.refresh.roll(since)
        except RefreshError as err:
            self.say(f"  the stable nodes did not all reach the new model: {err}")
            try:
                self.refresh.roll(self._place(block_of(self.handle), key, before, "stable"))
            except RefreshError as again:
                raise RefreshError(f"{err}; and rolling the stable nodes back: {again}") from err
            raise
