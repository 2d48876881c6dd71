"""render_user_data: the one cloud-init template, deterministic, within 16 KB (the EC2 limit),
carrying the spec (so the bundle checksum) and the stub that fetches and runs the bundle's agent
(the package's boot.py, byte for byte, Python 3.8 clean); a spec that cannot work fails naming
every bad field. cloud-init's own schema check runs on the
rendered documents in the node image (marked molecule: it needs podman)."""

from __future__ import annotations

import base64
import gzip
import json
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nodekit import REPO, podman

from infra.bootstrap import (
    DEFAULTS,
    MAX_USER_DATA,
    NODE_PATHS,
    OPTIONAL,
    REQUIRED,
    STUB,
    BootstrapError,
    BootstrapSpec,
    node_config,
    render_user_data,
)
from infra.bootstrap.torchfleet_agent import boot

SHA = "9f" * 32


def spec(cloud: str = "aws", **kw) -> BootstrapSpec:
    """The longest realistic spec: group mode with every hook and a long bucket name."""
    base = dict(
        cloud=cloud,
        region="ap-southeast-1" if cloud == "aws" else "cn-shanghai",
        stack=f"{cloud}-prod",
        bundle_bucket="torchfleet-" + cloud + "-prod-bundles-0123456789ab",
        bundle_key=f"bundles/{cloud}-prod/{SHA}.tar.gz",
        bundle_sha256=SHA,
        group_name=f"torchfleet-{cloud}-prod-{'asg' if cloud == 'aws' else 'ess'}",
        launch_hook="torchfleet-launch",
        terminate_hook="torchfleet-terminate",
        group_id="asg-bp1ffogfdauy0jw0abcd" if cloud == "alicloud" else None,
        metrics_group_id="123456789" if cloud == "alicloud" else None,
    )
    base.update(kw)
    return BootstrapSpec(**base)


def files(text: str) -> dict[str, dict]:
    doc = yaml.safe_load(text)
    return {f["path"]: f for f in doc["write_files"]}


def stub_of(text: str) -> bytes:
    entry = files(text)[NODE_PATHS["stub"]]
    assert entry["encoding"] == "gz+b64" and entry["permissions"] == "0755"
    return gzip.decompress(base64.b64decode(entry["content"]))


@pytest.mark.parametrize("cloud", ["aws", "alicloud"])
@pytest.mark.parametrize("mode", ["cold", "baked", "bake"])
def test_rendered_document_is_deterministic_small_and_complete(cloud: str, mode: str) -> None:
    s = spec(cloud, mode=mode)
    text = render_user_data(s)
    assert text == render_user_data(s), "same spec, different user-data: the group would roll"
    assert text.startswith("#cloud-config\n")
    # 16 KB: the EC2 limit; Alibaba allows 32 KB, the contract keeps both within 16.
    assert len(text.encode()) <= MAX_USER_DATA[cloud] and len(text.encode()) <= 16 * 1024, len(text)
    written = files(text)
    node = json.loads(written["/etc/torchfleet/node.json"]["content"])
    # the spec as JSON; `model` (a rollout track's override) only when set, so a stack without
    # one renders the bytes it did before the field existed (its group does not roll)
    want = {k: v for k, v in node_config(s).items() if not (k == "model" and v is None)}
    assert node == json.loads(json.dumps(want, default=list)), node
    assert written["/etc/torchfleet/node.json"]["permissions"] == "0600"
    for unit in (
        "torchfleet-bootstrap.service",
        "torchfleet-lifecycle.service",
        "torchfleet-metrics.service",
        "torchfleet-metrics.timer",
    ):
        source = (REPO / "infra" / "bootstrap" / "units" / unit).read_text().splitlines()
        shipped = written[f"/etc/systemd/system/{unit}"]["content"].splitlines()
        want = [line for line in source if not line.startswith("#")]
        assert shipped == [string.Template(line).substitute(NODE_PATHS) for line in want], unit
        assert "$" not in "".join(shipped), unit
    assert written[NODE_PATHS["command"]]["content"] == (
        f'#!/bin/sh\nexec /usr/bin/python3 {NODE_PATHS["stub"]} "$@"\n'
    )
    assert stub_of(text) == STUB.read_bytes()
    assert "##" not in text
    runcmd = yaml.safe_load(text)["runcmd"]
    assert ["systemctl", "enable", "torchfleet-bootstrap.service"] in runcmd
    assert ["systemctl", "start", "--no-block", "torchfleet-bootstrap.service"] in runcmd


def test_every_key_the_node_reads_is_required_or_has_a_default() -> None:
    """node.json's schema is the agent's NodeConfig (BootstrapSpec is that type): the bundle side
    requires or defaults each of its keys (but `model`, written only when given), so the file
    names every key; a spec without a required key is refused, naming it."""
    assert BootstrapSpec is boot.NodeConfig
    keys = set(boot.NodeConfig.__annotations__)
    assert set(REQUIRED) | set(DEFAULTS) | set(OPTIONAL) == keys
    assert not set(REQUIRED) & set(DEFAULTS)
    assert set(node_config(spec())) == keys - set(OPTIONAL)
    assert set(node_config(spec(model=None))) == keys - set(OPTIONAL)
    bare = BootstrapSpec(cloud="aws", bundle_sha256=SHA)
    with pytest.raises(BootstrapError) as err:
        render_user_data(bare)
    assert "region = None is invalid; allowed: a non-empty string" in str(err.value)
    assert "bundle_key = None" in str(err.value)


def test_a_key_the_agent_does_not_know_is_refused() -> None:
    bad = {**spec(), "group_nmae": "x"}
    with pytest.raises(BootstrapError, match=r"group_nmae = 'x' is invalid; allowed: a key of"):
        render_user_data(bad)  # type: ignore[arg-type]


def test_a_new_bundle_changes_the_user_data() -> None:
    a, b = render_user_data(spec()), render_user_data(spec(bundle_sha256="0e" * 32))
    assert a != b and "0e" * 32 in b


def test_the_stub_is_python38_clean_and_runs_alone(tmp_path: Path) -> None:
    """The stub runs on the node's python3 before any venv exists: standard library only at
    import, Python 3.8 syntax and APIs (like the whole agent package the bundle ships)."""
    stub = tmp_path / "boot.py"
    stub.write_bytes(stub_of(render_user_data(spec("alicloud"))))
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_py38.py"), str(STUB.parent)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # Alone, outside its package, with -I (no site-packages: no SDK to lean on) and no node.json.
    alone = subprocess.run(
        [sys.executable, "-I", str(stub), "status"], capture_output=True, text=True, check=False
    )
    assert alone.returncode == 1, alone.stdout + alone.stderr
    assert "no /etc/torchfleet/node.json: nothing to do" in alone.stdout


def test_a_bad_spec_names_every_field_and_what_is_allowed() -> None:
    bad = spec(
        cloud="gcp",
        mode="warm",
        bundle_sha256="abc",
        group_name=None,
        bundle_key="",
        service_port=70000,
        endpoints={"sqs": "http://127.0.0.1:1", "s3": "ftp://x"},
    )
    with pytest.raises(BootstrapError) as err:
        render_user_data(bad)
    text = str(err.value)
    for expected in (
        "cloud = 'gcp' is invalid; allowed: aws, alicloud",
        "mode = 'warm' is invalid; allowed: cold, baked, bake",
        "bundle_sha256 = 'abc' is invalid; allowed: 64 lowercase hex digits",
        "bundle_key = '' is invalid; allowed: a non-empty string",
        "launch_hook = 'torchfleet-launch' is invalid; allowed: a hook only with group_name",
        "service_port = 70000 is invalid; allowed: 1..65535",
        "endpoints['sqs'] = 'http://127.0.0.1:1' is invalid; allowed: keys for gcp",
    ):
        assert expected in text, text
    with pytest.raises(
        BootstrapError, match=r"endpoints\['s3'\] = 'ftp://x' is invalid; allowed: an http"
    ):
        render_user_data(spec(endpoints={"s3": "ftp://x"}))
    with pytest.raises(
        BootstrapError, match="allowed: keys for alicloud: oss, ess, cms, slb, kms, imds"
    ):
        render_user_data(spec("alicloud", endpoints={"s3": "http://127.0.0.1:1"}))


def test_instances_mode_has_no_hooks() -> None:
    s = spec(group_name=None, launch_hook=None, terminate_hook=None)
    node = json.loads(files(render_user_data(s))["/etc/torchfleet/node.json"]["content"])
    assert node["group_name"] is None and node["launch_hook"] is None


@pytest.mark.molecule
def test_cloud_init_accepts_the_documents(tmp_path: Path, node_image: str) -> None:
    for cloud in ("aws", "alicloud"):
        (tmp_path / f"{cloud}.yaml").write_text(render_user_data(spec(cloud)))
    out = podman(
        "run",
        "--rm",
        "-v",
        f"{tmp_path}:/ud:ro",
        "--entrypoint",
        "/bin/sh",
        node_image,
        "-c",
        "cloud-init schema --config-file /ud/aws.yaml && cloud-init schema --config-file /ud/alicloud.yaml",
        check=False,
    )
    assert out.returncode == 0 and out.stdout.count("Valid cloud-config") == 2, (
        out.stdout + out.stderr
    )
