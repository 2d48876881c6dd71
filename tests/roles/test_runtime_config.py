"""The inference_runtime role's /etc/torchfleet/runtime.yml, as Ansible renders it from the
role's own defaults, vars and template: the shadow-testing keys appear only with a shadow path,
and every key it writes is one the runtime's settings contract accepts with that value
(torchfleet_compat.runtime_settings)."""

from __future__ import annotations

import pytest
import yaml
from torchfleet_compat.runtime_settings import parse_value

BASE = {
    "__inference_runtime_model_file": "/var/lib/torchfleet/models/demo/model.pt",
    "inference_runtime_admin_token": "admin-token-0123456789abcdef",
}


def _config(render_templates, extra: dict) -> dict:
    text = render_templates("inference_runtime", {"runtime": "runtime.yml.j2"}, {**BASE, **extra})
    config = yaml.safe_load(text["runtime"])
    for key, value in config.items():
        parse_value(key, value)  # raises ValueError on a key or value the runtime refuses
    return config


def test_no_shadow_keys_by_default(render_templates):
    config = _config(render_templates, {})
    assert "shadow_model" not in config and "shadow_sample" not in config
    assert config["model"] == BASE["__inference_runtime_model_file"]


@pytest.mark.parametrize("sample", [0.5, "1.0"])
def test_a_shadow_path_writes_the_path_and_its_sample(render_templates, sample):
    path = "/var/lib/torchfleet/models/demo/shadow.pt"
    config = _config(
        render_templates,
        {"inference_runtime_shadow_model": path, "inference_runtime_shadow_sample": sample},
    )
    assert config["shadow_model"] == path
    assert config["shadow_sample"] == float(sample)
