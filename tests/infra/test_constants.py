"""infra/constants.py against the layers that cannot import it (the Pulumi project file, the
runtime a node runs, the role defaults): the same name, path and port everywhere."""

from __future__ import annotations

from pathlib import Path

import yaml
from torchfleet_runtime import config as runtime_config
from torchfleet_runtime import server

from infra.constants import HEALTH_PATH, PROJECT, SERVICE_PORT

ROOT = Path(__file__).resolve().parents[2]


def test_the_project_name_is_pulumis():
    assert yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["name"] == PROJECT


def test_the_service_port_is_the_runtimes_and_the_roles_default():
    assert runtime_config.Config().port == SERVICE_PORT
    defaults = yaml.safe_load((ROOT / "roles/inference_runtime/defaults/main.yml").read_text())
    assert defaults["inference_runtime_port"] == SERVICE_PORT


def test_the_health_path_is_a_runtime_route():
    assert HEALTH_PATH in server.ROUTES
