"""The KServe example in docs/open-inference-protocol.md agrees with the stack's Kubernetes
workload (infra/k8s/workload.py): the same image, port, probes, user, volumes and runtime
settings, the model where KServe's storage initializer puts it, the v2 protocol."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from torchfleet_compat.runtime_settings import ENV_PREFIX, FIELDS

from infra import config
from infra.k8s import workload

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "open-inference-protocol.md"
KSERVE_MODELS = "/mnt/models"


def _example() -> dict[str, dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
    docs = [d for block in blocks for d in yaml.safe_load_all(block)]
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module", params=["aws-k8s", "alicloud-k8s"])
def stack_container(request) -> tuple[dict[str, Any], dict[str, Any], Any]:
    raw = yaml.safe_load((ROOT / f"Pulumi.{request.param}.yaml").read_text())["config"]
    cfg = config.load({k.split(":", 1)[1]: v for k, v in raw.items()}, request.param)
    pod = workload.deployment(cfg, workload.Placement({}, {}))["spec"]["template"]["spec"]
    return pod, pod["containers"][0], cfg


def test_the_example_is_a_v2_serving_runtime_and_its_inference_service():
    ex = _example()
    assert set(ex) == {"ServingRuntime", "InferenceService"}
    rt, isvc = ex["ServingRuntime"], ex["InferenceService"]
    assert rt["spec"]["protocolVersions"] == ["v2"]
    predictor = isvc["spec"]["predictor"]["model"]
    assert predictor["runtime"] == rt["metadata"]["name"] and predictor["protocolVersion"] == "v2"
    formats = {f["name"] for f in rt["spec"]["supportedModelFormats"]}
    assert predictor["modelFormat"]["name"] in formats


def test_the_container_is_the_workloads(stack_container):
    pod, want, cfg = stack_container
    rt = _example()["ServingRuntime"]["spec"]
    (got,) = rt["containers"]
    assert (
        got["image"].rsplit("/", 1)[-1].split(":")[0]
        == want["image"].rsplit("/", 1)[-1].split(":")[0]
    )
    assert got["ports"] == want["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert got[probe] == want[probe], probe
    assert got["securityContext"] == want["securityContext"]
    assert got["volumeMounts"] == want["volumeMounts"] and rt["volumes"] == pod["volumes"]
    gpu = workload.GPU_RESOURCE
    assert got["resources"]["limits"][gpu] == want["resources"]["limits"][gpu]
    env = {e["name"]: e["value"] for e in got["env"]}
    expected = {e["name"]: e["value"] for e in want["env"]}
    expected[ENV_PREFIX + "MODEL"] = f"{KSERVE_MODELS}/{workload.stable_model(cfg)}"
    assert env == expected
    # every TORCHFLEET_ variable names a runtime setting
    unknown = [
        k for k in env if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :].lower() not in FIELDS
    ]
    assert not unknown
