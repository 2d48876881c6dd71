"""The monitoring role's decisions, in Python instead of long Jinja: which targets Prometheus
scrapes and with which labels, and how Alertmanager routes. The role's templates only dump
what these return (`to_nice_yaml` / `to_nice_json`); the tests import the same functions.

Contract (every discovery mode gives every node's series the same target labels):
  stack, node, instance_type, lifecycle (spot | on-demand), plus zone with EC2 discovery. ecs
  discovery reads file_sd lists like file discovery; a timer writes them
  (files/torchfleet_ecs_sd.py, with `torchfleet_file_sd` from this file).
  Jobs: torchfleet-runtime (the runtime's /metrics; over HTTPS with `runtime_tls_ca_file` and
  `runtime_tls_server_name`: a stack with tls.backend), torchfleet-node (node exporter),
  prometheus and alertmanager (the monitoring host itself).

- `torchfleet_inventory_nodes(hosts, hostvars, stack)`: the inventory's gpu_nodes as plain
  dicts (address: private_ip, else ansible_host, else the name).
- `torchfleet_first_address(hosts, hostvars)`: the first host's address ('' for none).
- `torchfleet_file_sd(nodes, port)`: a file_sd target list, one group per node.
- `torchfleet_prometheus_config(settings)`: prometheus.yml as a dict.
- `torchfleet_alertmanager_config(settings)`: alertmanager.yml as a dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RUNTIME_JOB = "torchfleet-runtime"
NODE_JOB = "torchfleet-node"
# The scrape jobs of the nodes, keyed by the settings key that holds their port.
NODE_JOBS = ((RUNTIME_JOB, "runtime_port"), (NODE_JOB, "node_exporter_port"))
RECEIVERS = ("none", "webhook", "email", "slack")


class MonitoringConfigError(ValueError):
    pass


def torchfleet_inventory_nodes(
    hosts: list[str], hostvars: Mapping[str, Any], stack: str
) -> list[dict[str, str]]:
    nodes = []
    for name in hosts:
        hv = hostvars[name]
        spot = hv.get("torchfleet_spot", False)
        nodes.append(
            {
                "node": str(name),
                "address": _address(hv, name),
                "stack": stack,
                "cloud": str(hv.get("torchfleet_cloud", "")),
                "instance_type": str(hv.get("torchfleet_instance_type") or "unknown"),
                "lifecycle": "spot" if str(spot).lower() in ("true", "yes", "1") else "on-demand",
            }
        )
    return nodes


def _address(hv: Mapping[str, Any], name: str) -> str:
    # Scraping and log shipping stay inside the VPC: the private address first.
    return str(hv.get("private_ip") or hv.get("ansible_host") or name)


def torchfleet_first_address(hosts: list[str], hostvars: Mapping[str, Any]) -> str:
    return _address(hostvars[hosts[0]], hosts[0]) if hosts else ""


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def torchfleet_file_sd(nodes: list[Mapping[str, str]], port: int) -> list[dict[str, Any]]:
    return [
        {
            "targets": [_host_port(n["address"], int(port))],
            "labels": {
                k: n[k]
                for k in ("stack", "node", "cloud", "instance_type", "lifecycle")
                if n.get(k)
            },
        }
        for n in nodes
    ]


def _ec2_job(job: str, port: int, settings: Mapping[str, Any]) -> dict[str, Any]:
    sd: dict[str, Any] = {
        "port": port,
        "refresh_interval": settings.get("ec2_refresh_interval", "60s"),
        # The same filter infra's discovery output names (infra/aws/fleet.py): the stack's GPU
        # nodes that are running. Stopped nodes (schedules) drop out instead of alerting.
        "filters": [
            {"name": "tag:torchfleet-role", "values": ["gpu-node"]},
            {"name": "tag:stack", "values": [settings["stack"]]},
            {"name": "instance-state-name", "values": ["running"]},
        ],
    }
    if settings.get("ec2_region"):
        sd["region"] = settings["ec2_region"]  # else Prometheus asks the instance metadata
    relabel = [
        {"source_labels": ["__meta_ec2_tag_stack"], "target_label": "stack"},
        # The instance id: unique, and what the console, the CLI and spot notices name.
        {"source_labels": ["__meta_ec2_instance_id"], "target_label": "node"},
        {"source_labels": ["__meta_ec2_tag_Name"], "target_label": "name"},
        {"source_labels": ["__meta_ec2_instance_type"], "target_label": "instance_type"},
        {"source_labels": ["__meta_ec2_availability_zone"], "target_label": "zone"},
        {"target_label": "cloud", "replacement": "aws"},
        # EC2 sets the lifecycle only for spot (and scheduled) instances.
        {"target_label": "lifecycle", "replacement": "on-demand"},
        {
            "source_labels": ["__meta_ec2_instance_lifecycle"],
            "regex": "(.+)",
            "target_label": "lifecycle",
        },
    ]
    return {"job_name": job, "ec2_sd_configs": [sd], "relabel_configs": relabel}


def _file_job(job: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "job_name": job,
        "file_sd_configs": [
            {
                "files": [f"{settings['file_sd_dir']}/{job}.json"],
                "refresh_interval": "1m",
            }
        ],
    }


def torchfleet_prometheus_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    discovery = settings["discovery"]
    if discovery not in ("ec2", "ecs", "file"):
        raise MonitoringConfigError(f"discovery={discovery!r}: allowed ec2, ecs, file")
    self_labels = {"stack": settings["stack"]}
    jobs: list[dict[str, Any]] = [
        {
            "job_name": "prometheus",
            "static_configs": [
                {"targets": [settings["prometheus_address"]], "labels": self_labels}
            ],
        },
    ]
    if settings.get("alertmanager_address"):
        jobs.append(
            {
                "job_name": "alertmanager",
                "static_configs": [
                    {"targets": [settings["alertmanager_address"]], "labels": self_labels}
                ],
            }
        )
    if settings.get("spend_address"):  # the torchfleet-spend exporter (tasks/spend.yml)
        jobs.append(
            {
                "job_name": "torchfleet-spend",
                "static_configs": [{"targets": [settings["spend_address"]], "labels": self_labels}],
            }
        )
    for job, port_key in NODE_JOBS:
        jobs.append(
            _ec2_job(job, int(settings[port_key]), settings)
            if discovery == "ec2"
            else _file_job(job, settings)
        )
    if settings.get("runtime_tls_ca_file"):
        # tls.backend: the runtime serves HTTPS with the stack's node certificate; trust it
        # alone, for the one name it carries (the targets are addresses)
        runtime = next(j for j in jobs if j["job_name"] == RUNTIME_JOB)
        runtime["scheme"] = "https"
        runtime["tls_config"] = {
            "ca_file": settings["runtime_tls_ca_file"],
            "server_name": settings["runtime_tls_server_name"],
        }
    jobs.extend(settings.get("extra_scrape_configs") or [])
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": settings["scrape_interval"],
            "scrape_timeout": settings.get("scrape_timeout") or settings["scrape_interval"],
            "evaluation_interval": settings["evaluation_interval"],
            "external_labels": {
                "stack": settings["stack"],
                **(settings.get("external_labels") or {}),
            },
        },
        "rule_files": [f"{settings['rule_dir']}/*.rules.yml"],
        "scrape_configs": jobs,
    }
    if settings.get("alertmanager_address"):
        config["alerting"] = {
            "alertmanagers": [{"static_configs": [{"targets": [settings["alertmanager_address"]]}]}]
        }
    return config


def _receiver(settings: Mapping[str, Any]) -> dict[str, Any]:
    kind = settings.get("receiver", "none")
    receiver: dict[str, Any] = {"name": "default"}
    if kind == "webhook":
        receiver["webhook_configs"] = [{"url": settings["webhook_url"], "send_resolved": True}]
    elif kind == "slack":
        receiver["slack_configs"] = [
            {
                "api_url": settings["slack_api_url"],
                "channel": settings["slack_channel"],
                "send_resolved": True,
                "title": "[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }} {{ .CommonLabels.stack }}",
                "text": "{{ range .Alerts }}{{ .Annotations.summary }}\n{{ end }}",
            }
        ]
    elif kind == "email":
        receiver["email_configs"] = [{"to": settings["email_to"], "send_resolved": True}]
    elif kind != "none":
        raise MonitoringConfigError(f"receiver={kind!r}: allowed {', '.join(RECEIVERS)}")
    return receiver


def torchfleet_alertmanager_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    route: dict[str, Any] = {
        "receiver": "default",
        "group_by": ["alertname", "stack"],
        "group_wait": settings.get("group_wait", "30s"),
        "group_interval": settings.get("group_interval", "5m"),
        "repeat_interval": settings.get("repeat_interval", "4h"),
    }
    config: dict[str, Any] = {"route": route, "receivers": [_receiver(settings)]}
    if settings.get("receiver") == "email":
        config["global"] = {
            "smtp_from": settings["email_from"],
            "smtp_smarthost": settings["email_smarthost"],
            "smtp_require_tls": True,
            **(
                {
                    "smtp_auth_username": settings["email_auth_username"],
                    "smtp_auth_password": settings["email_auth_password"],
                }
                if settings.get("email_auth_username")
                else {}
            ),
        }
    # Spare people the echoes of one cause: a node the cloud is reclaiming is expected to go
    # not-ready and dark; a stack with no ready node says more than each node's alert; a
    # stopped runtime is a not-ready node first and a dead scrape target second; a degraded node
    # (a replica down) is not ready because of it.
    config["inhibit_rules"] = [
        {
            "source_matchers": ['alertname="TorchfleetSpotInterruptionNotice"'],
            "target_matchers": ['alertname=~"TorchfleetNodeNotReady|TorchfleetTargetDown"'],
            "equal": ["stack", "node"],
        },
        {
            "source_matchers": ['alertname="TorchfleetNoReadyNodes"'],
            "target_matchers": ['alertname="TorchfleetNodeNotReady"'],
            "equal": ["stack"],
        },
        {
            "source_matchers": ['alertname="TorchfleetNodeNotReady"'],
            "target_matchers": ['alertname="TorchfleetTargetDown"', f'job="{RUNTIME_JOB}"'],
            "equal": ["stack", "node"],
        },
        {
            "source_matchers": ['alertname="TorchfleetReplicaDown"'],
            "target_matchers": ['alertname="TorchfleetNodeNotReady"'],
            "equal": ["stack", "node"],
        },
    ]
    return config


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "torchfleet_inventory_nodes": torchfleet_inventory_nodes,
            "torchfleet_first_address": torchfleet_first_address,
            "torchfleet_file_sd": torchfleet_file_sd,
            "torchfleet_prometheus_config": torchfleet_prometheus_config,
            "torchfleet_alertmanager_config": torchfleet_alertmanager_config,
        }
