"""infra.bundle: one reproducible, checksummed node bundle per stack. Same tree -> same bytes
(also from empty caches, the runtime wheel rebuilt), any change -> a new sha256; the archive's
members are sorted, owned by root, dated 1980, the gzip header undated; the manifest lists every
member with its checksum and names the model; a bad stack fails naming the stacks there are."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from nodekit import REPO

from infra import bundle as bundle_mod
from infra.config import ConfigError


def members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


def read(path: Path, name: str) -> bytes:
    with tarfile.open(path) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return f.read()


def test_same_tree_same_bytes_even_from_empty_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = bundle_mod.build("aws-prod")
    assert bundle_mod.build("aws-prod") == first  # the cache answers
    monkeypatch.setattr(bundle_mod, "CACHE", tmp_path / "bundles")
    monkeypatch.setattr(bundle_mod, "WHEEL_CACHE", tmp_path / "wheels")  # the wheel is rebuilt too
    again = bundle_mod.build("aws-prod", tmp_path / "out")
    assert again.sha256 == first.sha256 and again.path.read_bytes() == first.path.read_bytes()
    assert again.path == tmp_path / "out" / f"aws-prod-{first.sha256[:12]}.tar.gz"
    assert first.sha256 == hashlib.sha256(first.path.read_bytes()).hexdigest()
    assert first.key == f"bundles/aws-prod/{first.sha256}.tar.gz"
    assert first.version.endswith("-" + first.sha256[:12])


def test_a_changed_file_makes_a_new_bundle(tmp_path: Path) -> None:
    group_vars = tmp_path / "group_vars"
    shutil.copytree(REPO / "inventories" / "aws-prod" / "group_vars", group_vars)
    source = (group_vars / "all.yml").read_text()
    same = bundle_mod.build("aws-prod", group_vars=group_vars)
    assert same.sha256 == bundle_mod.build("aws-prod").sha256
    (group_vars / "all.yml").write_text(source + "inference_runtime_drain_timeout_s: 90\n")
    assert bundle_mod.build("aws-prod", group_vars=group_vars).sha256 != same.sha256


def test_archive_contents_metadata_and_manifest() -> None:
    made = bundle_mod.build("alicloud-prod")
    raw = made.path.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and raw[4:8] == b"\0\0\0\0", "gzip header carries a time"
    found = members(made.path)
    assert list(found) == sorted(found)
    assert all(
        m.mtime == bundle_mod.FIXED_MTIME and m.uid == m.gid == 0 and m.uname == "root"
        for m in found.values()
    )
    assert all(m.mode in (0o644, 0o755) for m in found.values())
    manifest = json.loads(read(made.path, "manifest.json"))
    assert manifest["format"] == bundle_mod.FORMAT and manifest["stack"] == "alicloud-prod"
    files = manifest["files"]
    assert set(files) == {n for n, m in found.items() if m.isfile()} - {"manifest.json"}
    for name, digest in files.items():
        assert hashlib.sha256(read(made.path, name)).hexdigest() == digest, name
    for needed in (
        "playbooks/site.yml",
        "playbooks/baked.yml",
        "compat/matrix.yml",
        "roles/pytorch/tasks/main.yml",
        "inventories/alicloud-prod/group_vars/all.yml",
        "bootstrap/callback_plugins/torchfleet_status.py",
        "agent/torchfleet_agent/boot.py",
        "agent/torchfleet_agent/__main__.py",
        "node.json",
        manifest["runtime_wheel"],
    ):
        assert needed in files, needed
    assert manifest["runtime_wheel"].startswith("wheels/torchfleet_runtime-") and manifest[
        "runtime_wheel"
    ].endswith(".whl")
    assert not [n for n in found if "__pycache__" in n or n.endswith(".pyc")]
    assert manifest["model"] == {
        "model_source": "oss://REPLACE-with-your-bucket/models/model.pt",
        "model_checksum": "sha256:REPLACE-with-the-model-sha256",
        "metadata_source": "oss://REPLACE-with-your-bucket/models/model.json",
        "metadata_checksum": "sha256:REPLACE-with-the-metadata-sha256",
    }
    node = json.loads(read(made.path, "node.json"))
    assert (
        node["group_vars"]["torchfleet_cuda_profile"] == "cu121"  # Pulumi.alicloud-prod.yaml
        and "ansible_user" not in node["group_vars"]
    )
    assert node["instance_types"]["ecs.gn6i-c4g1.xlarge"] == {
        "gpu_model": "T4",
        "gpu_count": 1,
        "compute_capability": "7.5",
    }


def test_bad_stacks_fail_with_what_exists(tmp_path: Path) -> None:
    with pytest.raises(
        bundle_mod.BundleError, match=r"group_vars does not exist.*aws-dev, aws-prod"
    ):
        bundle_mod.build("aws-staging")
    gv = tmp_path / "gv"
    gv.mkdir()
    with pytest.raises(bundle_mod.BundleError, match="no stack file"):
        bundle_mod.build("gcp-prod", group_vars=gv)


def test_an_invalid_stack_config_fails_before_packing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra import stacks

    monkeypatch.setattr(
        stacks,
        "load_stack_config",
        lambda stack: {"torchfleet:cloud": "aws", "torchfleet:cuda_profile": "cu999"},
    )
    with pytest.raises(ConfigError, match="cuda_profile"):
        bundle_mod.build("aws-prod", tmp_path)
    assert not list(tmp_path.iterdir())


def test_make_bundle_prints_the_bundle() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "infra.bundle", "aws-dev"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert (
        printed["sha256"] == bundle_mod.build("aws-dev").sha256 and Path(printed["path"]).exists()
    )
    bad = subprocess.run(
        [sys.executable, "-m", "infra.bundle", "aws-nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert bad.returncode == 2 and "aws-nope" in bad.stderr
    gzip.decompress(Path(printed["path"]).read_bytes())  # a whole archive
