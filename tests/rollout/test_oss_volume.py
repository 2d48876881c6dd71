"""An Alibaba group stack's model volume: OssVolume places a checked copy under models/ and
reads one back through the official OSS SDK (alibabacloud_oss_v2), against the loopback fake
that recomputes each request's V4 signature with the SDK's own signer
(tests/bootstrap/fake_alibaba.py), with the operator's keys as infra.credentials reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra import config
from infra.rollout.tracks import OssVolume, S3Volume, VolumeError, oss_client, volume_of

REPO = Path(__file__).resolve().parents[2]
from fake_alibaba import FakeAlibaba  # noqa: E402  (tests/rollout/conftest.py: importable)

BUCKET = "example-torchfleet-models"


def test_a_candidate_is_placed_in_oss_under_its_digest_and_read_back(tmp_path, alibaba_keys):
    model = tmp_path / f"{'c' * 64}.pt"
    model.write_bytes(b"weights v4")
    with FakeAlibaba(lambda action, params: {}) as fake:
        volume = OssVolume(
            BUCKET, "models/", tmp_path / "cache", fake.region, oss_client(fake.region, fake.url)
        )
        assert volume.put(model) == model.name
        assert fake.objects[(BUCKET, f"models/{model.name}")] == b"weights v4"
        got = volume.fetch(model.name)
        assert got.read_bytes() == b"weights v4"
        assert not got.with_suffix(".json").exists()  # no sidecar in the bucket: none here
        with pytest.raises(VolumeError, match=f"oss://{BUCKET}/models/missing.pt"):
            volume.fetch("missing.pt")
    assert fake.refused == []
    assert [c["action"] for c in fake.calls][:2] == ["PutObject", "GetObject"]


def test_a_request_signed_with_other_keys_is_refused_and_named(tmp_path, alibaba_keys, monkeypatch):
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "not-the-secret")
    model = tmp_path / "a.pt"
    model.write_bytes(b"x")
    with FakeAlibaba(lambda action, params: {}) as fake:
        volume = OssVolume(
            BUCKET, "models/", tmp_path / "cache", fake.region, oss_client(fake.region, fake.url)
        )
        with pytest.raises(VolumeError, match=f"uploading a.pt to oss://{BUCKET}"):
            volume.put(model)
    assert fake.objects == {} and fake.refused


def _settings(stack: str) -> dict:
    values = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"]
    return {k.split(":", 1)[1]: v for k, v in values.items()}


def test_volume_of_an_alicloud_group_stack_is_its_model_bucket_in_oss(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFLEET_PRICES", "offline")
    raw = {**_settings("alicloud-prod"), "model_bucket": BUCKET}
    volume = volume_of(config.load(raw, "alicloud-prod"), tmp_path)
    assert isinstance(volume, OssVolume) and not isinstance(volume, S3Volume)
    assert (volume.bucket, volume.prefix) == (BUCKET, "models/")
    with pytest.raises(VolumeError, match="model_bucket is unset"):
        volume_of(config.load(_settings("alicloud-prod"), "alicloud-prod"), tmp_path)


def test_volume_of_alicloud_k8s_is_the_pods_oss_model_volume(tmp_path, monkeypatch):
    """The ACK pods mount model_bucket/kubernetes.model_prefix through the OSS CSI driver: the
    candidate is placed there, beside the stable model.pt."""
    monkeypatch.setenv("TORCHFLEET_PRICES", "offline")
    cfg = config.load(_settings("alicloud-k8s"), "alicloud-k8s")
    volume = volume_of(cfg, tmp_path)
    assert isinstance(volume, OssVolume)
    assert cfg.kubernetes is not None
    assert (volume.bucket, volume.prefix) == (cfg.model_bucket, cfg.kubernetes.model_prefix)
