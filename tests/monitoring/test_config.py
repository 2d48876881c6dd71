"""The configuration the role writes, from its filter plugin, checked by the real tools: every
discovery mode passes `promtool check config`, every receiver `amtool check-config`; file
discovery turns inventory hosts into labelled targets; the dashboard artifact is current and
speaks to the data source the role provisions."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from monitoring_support import DASHBOARD_JSON, ROLE, RULE_FILES, need

from roles.monitoring.generator import __main__ as generator
from roles.monitoring.generator import dashboard

SETTINGS = {
    "stack": "aws-prod",
    "scrape_interval": "15s",
    "evaluation_interval": "15s",
    "runtime_port": 8080,
    "node_exporter_port": 9100,
    "prometheus_address": "127.0.0.1:9090",
    "alertmanager_address": "127.0.0.1:9093",
}


def _write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [need("promtool"), "check", "config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.parametrize("discovery", ["ec2", "ecs", "file"])
def test_prometheus_config_passes_promtool(
    discovery: str, filters: ModuleType, tmp_path: Path
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    for path in RULE_FILES:
        (rules / path.name).write_text(path.read_text())
    config = filters.torchfleet_prometheus_config(
        {
            **SETTINGS,
            "discovery": discovery,
            "ec2_region": "eu-central-1",
            "rule_dir": str(rules),
            "file_sd_dir": str(tmp_path),
        }
    )
    done = _promtool_check(_write(tmp_path / "p.yml", config))
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in done.stdout, done.stdout
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"prometheus", "alertmanager", "torchfleet-runtime", "torchfleet-node"}
    if discovery == "ec2":
        sd = jobs["torchfleet-runtime"]["ec2_sd_configs"][0]
        assert sd["port"] == 8080 and sd["region"] == "eu-central-1"
        assert {f["name"]: f["values"] for f in sd["filters"]} == {
            "tag:torchfleet-role": ["gpu-node"],
            "tag:stack": ["aws-prod"],
            "instance-state-name": ["running"],
        }
        targets = {r["target_label"] for r in jobs["torchfleet-node"]["relabel_configs"]}
        assert {"stack", "node", "instance_type", "lifecycle", "zone"} <= targets


def test_the_runtime_is_scraped_over_https_trusting_the_nodes_certificate_alone(
    filters: ModuleType, tmp_path: Path
) -> None:
    """A stack with tls.backend: the monitoring host gets the nodes' certificate
    (monitoring_runtime_tls_ca, written to the CA file) and the one name it carries; the node
    exporter's job stays as it was."""
    ca = tmp_path / "runtime-ca.pem"
    ca.write_text("PEM of the nodes' certificate\n")  # promtool checks the config, not the file
    config = filters.torchfleet_prometheus_config(
        {
            **SETTINGS,
            "discovery": "ec2",
            "ec2_region": "us-east-1",
            "rule_dir": str(tmp_path),
            "file_sd_dir": str(tmp_path),
            "runtime_tls_ca_file": str(ca),
            "runtime_tls_server_name": "node.torchfleet.internal",
        }
    )
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["torchfleet-runtime"]["scheme"] == "https"
    assert jobs["torchfleet-runtime"]["tls_config"] == {
        "ca_file": str(ca),
        "server_name": "node.torchfleet.internal",
    }
    assert "scheme" not in jobs["torchfleet-node"] and "tls_config" not in jobs["torchfleet-node"]
    _promtool_check(_write(tmp_path / "p.yml", config))


def test_ec2_discovery_tags_match_the_ones_infra_sets(filters: ModuleType) -> None:
    from infra.interface import NODE_ROLE_TAG

    sd = filters.torchfleet_prometheus_config({**SETTINGS, "discovery": "ec2", "rule_dir": "/r"})
    filters_ = sd["scrape_configs"][2]["ec2_sd_configs"][0]["filters"]
    assert {"name": f"tag:{NODE_ROLE_TAG[0]}", "values": [NODE_ROLE_TAG[1]]} in filters_


def test_file_sd_from_the_inventory(filters: ModuleType) -> None:
    hostvars = {
        "aws-dev-gpu-0": {
            "ansible_host": "203.0.113.7",
            "private_ip": "10.0.1.5",
            "torchfleet_instance_type": "g6.xlarge",
            "torchfleet_spot": True,
            "torchfleet_cloud": "aws",
        },
        "lab-1": {"ansible_host": "fd00::7", "torchfleet_spot": "false"},
    }
    nodes = filters.torchfleet_inventory_nodes(list(hostvars), hostvars, "aws-dev")
    assert filters.torchfleet_file_sd(nodes, 9100) == [
        {
            "targets": ["10.0.1.5:9100"],
            "labels": {
                "stack": "aws-dev",
                "node": "aws-dev-gpu-0",
                "cloud": "aws",
                "instance_type": "g6.xlarge",
                "lifecycle": "spot",
            },
        },
        {
            "targets": ["[fd00::7]:9100"],
            "labels": {
                "stack": "aws-dev",
                "node": "lab-1",
                "instance_type": "unknown",
                "lifecycle": "on-demand",
            },
        },
    ]
    assert filters.torchfleet_first_address(["aws-dev-gpu-0"], hostvars) == "10.0.1.5"
    assert filters.torchfleet_first_address([], hostvars) == ""


RECEIVERS = {
    "none": {},
    "webhook": {"webhook_url": "https://hooks.example.org/torchfleet"},
    "slack": {
        "slack_api_url": "https://hooks.slack.com/services/T0/B0/x",
        "slack_channel": "#fleet",
    },
    "email": {
        "email_to": "oncall@example.org",
        "email_from": "prometheus@example.org",
        "email_smarthost": "smtp.example.org:587",
        "email_auth_username": "prometheus",
        "email_auth_password": "s3cret",
    },
}


@pytest.mark.parametrize("receiver", sorted(RECEIVERS))
def test_alertmanager_config_passes_amtool(
    receiver: str, filters: ModuleType, tmp_path: Path
) -> None:
    config = filters.torchfleet_alertmanager_config({"receiver": receiver, **RECEIVERS[receiver]})
    done = subprocess.run(
        [need("amtool"), "check-config", str(_write(tmp_path / "am.yml", config))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and " - 1 receivers" in done.stdout, done.stdout
    assert " - 4 inhibit rules" in done.stdout, done.stdout


def test_an_unknown_receiver_or_discovery_is_refused(filters: ModuleType) -> None:
    with pytest.raises(
        filters.MonitoringConfigError, match="receiver='pager'.*allowed none, webhook"
    ):
        filters.torchfleet_alertmanager_config({"receiver": "pager"})
    with pytest.raises(
        filters.MonitoringConfigError, match="discovery=.consul.: allowed ec2, ecs, file"
    ):
        filters.torchfleet_prometheus_config({**SETTINGS, "discovery": "consul", "rule_dir": "/r"})


def test_generated_artifacts_are_current() -> None:
    stale = [p for p, text in generator.artifacts().items() if p.read_text() != text]
    assert not stale, f"stale: {stale}; run .venv/bin/python -m roles.monitoring.generator"


def test_dashboard_uses_the_provisioned_data_source_everywhere() -> None:
    board = json.loads(DASHBOARD_JSON.read_text())
    provisioned = yaml.safe_load(
        (ROLE / "templates" / "grafana-datasources.yml.j2")
        .read_text()
        .replace("{{", "")
        .replace("}}", "")
    )["datasources"][0]["uid"]
    assert provisioned == dashboard.DATASOURCE_UID
    uids = {p["datasource"]["uid"] for p in board["panels"] if p["type"] != "row"}
    uids |= {t["datasource"]["uid"] for p in board["panels"] for t in p.get("targets", [])}
    assert uids == {dashboard.DATASOURCE_UID}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in board["panels"]:  # the 24-column grid holds every panel
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]


def test_every_role_option_is_documented() -> None:
    """Each default has an entry in an entry point of meta/argument_specs.yml, and vice versa."""
    defaults = set(yaml.safe_load((ROLE / "defaults/main.yml").read_text()))
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]
    options = set().union(*(set(entry["options"]) for entry in specs.values()))
    assert defaults == options, (
        f"only in defaults {defaults - options}, only in specs {options - defaults}"
    )


def test_the_versions_row_compares_each_version_by_recorded_series() -> None:
    """The A/B row reads one recorded series per panel, each by model_version, and each is a
    rule of the role (promtool's ab_versions.test.yml checks their values)."""
    board = json.loads(DASHBOARD_JSON.read_text())
    recorded = {
        r["record"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for r in group["rules"]
        if "record" in r
    }
    titles = [p["title"] for p in board["panels"]]
    start = titles.index("Versions compared")
    row = board["panels"][start + 1 : start + 4]
    assert board["panels"][start]["type"] == "row" and len(row) == 3
    for panel in row:
        (target,) = panel["targets"]
        series = target["expr"].split("{", 1)[0]
        assert series.startswith("stack_version:") and series in recorded, series
        assert target["legendFormat"] == "{{model_version}}"
