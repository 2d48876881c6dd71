"""The Alibaba SDK pins of the stub (boot.SDK_PINS) install offline on the node image's own
Python (Debian 12, CPython 3.11) and carry the agent's Alibaba calls there: a venv from a
wheelhouse, then alibaba_node_check.py against the fake cloud, with no network at all. Marked
molecule: it runs a podman container (the AWS path boots a whole node in test_node_bootstrap.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nodekit import CACHE, REPO, _cross, _pip, _stamped, podman, sdk_pins_for

pytestmark = pytest.mark.molecule


def test_alibaba_pins_install_and_work_on_the_node_python(tmp_path: Path, node_image: str) -> None:
    pins = sdk_pins_for("alicloud", "3.11")
    wheels = _stamped(
        CACHE / "wheels-alicloud-sdk-cp311",
        " ".join(pins),
        lambda d: _pip("download", *_cross("--no-deps", "-d", str(d)), "pip", *pins),
    )
    (tmp_path / "requirements.txt").write_text("\n".join(pins) + "\n")
    script = (
        "set -e; python3 -m venv --without-pip /v; "
        "/v/bin/python $(ls /wheels/pip-*.whl)/pip install -q --no-index --find-links /wheels "
        "-r /work/requirements.txt; PYTHONPATH=/agent:/fakes /v/bin/python /fakes/alibaba_node_check.py"
    )
    out = podman(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{wheels}:/wheels:ro",
        "-v",
        f"{tmp_path}:/work:ro",
        "-v",
        f"{REPO / 'infra' / 'bootstrap'}:/agent:ro",
        "-v",
        f"{REPO / 'tests' / 'bootstrap'}:/fakes:ro",
        "--entrypoint",
        "/bin/sh",
        node_image,
        "-c",
        script,
        check=False,
        timeout=600,
    )
    assert out.returncode == 0 and "ok: Python 3.11" in out.stdout, out.stdout + out.stderr[-3000:]
