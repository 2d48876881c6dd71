"""The scaling metrics a ready group node publishes every 15 s (torchfleet-metrics.timer), read
from the runtime's /metrics: QueueDepth, GpuUtilization (when NVML reports: the runtime's `gpu`
extra, which the inference_runtime role installs on GPU nodes) and RequestRate."""

from __future__ import annotations

import time
import urllib.request
from typing import Any, Sequence

from . import boot
from .cloud import Metrics, cloud_of
from .state import State

SAMPLE = "/run/torchfleet/metrics-sample.json"  # the last request count, for RequestRate
# The names the scaling policies and alarms read (infra/nodeboot.py imports them).
QUEUE_METRIC = "QueueDepth"  # instances waiting in the runtime's batch queue
GPU_METRIC = "GpuUtilization"  # percent, mean over the GPUs that serve a replica
REQUEST_METRIC = "RequestRate"  # requests/s answered (Alibaba only: AWS has the ALB's count)


def scrape(
    text: str, previous: dict[str, Any] | None = None, now_s: float | None = None
) -> tuple[Metrics, dict[str, float]]:
    """QueueDepth (instances waiting), GpuUtilization (percent, mean over the GPUs that serve a
    model replica: those with a `device` label; every GPU when none has one, as runtimes before
    replicas wrote it), RequestRate (requests answered per second since `previous`, the last
    sample {"t", "requests"}). Returns (values, sample)."""
    queue, gpus, serving, requests = 0.0, [], [], 0.0
    for line in text.splitlines():
        if line.startswith("torchfleet_queue_depth "):
            queue = float(line.split()[1])
        elif line.startswith("torchfleet_gpu_utilization_ratio{"):
            value = float(line.rsplit(" ", 1)[1])
            gpus.append(value)
            if 'device="cuda' in line:
                serving.append(value)
        elif line.startswith("torchfleet_requests_total{"):
            requests += float(line.rsplit(" ", 1)[1])
    values: Metrics = {QUEUE_METRIC: (queue, "Count")}
    busy = serving or gpus
    if busy:
        values[GPU_METRIC] = (100.0 * sum(busy) / len(busy), "Percent")
    sample = {"t": time.time() if now_s is None else now_s, "requests": requests}
    # a lower count than last time: the runtime restarted
    if previous and sample["t"] > previous["t"] and requests >= previous["requests"]:
        values[REQUEST_METRIC] = (
            (requests - previous["requests"]) / (sample["t"] - previous["t"]),
            "Count/Second",
        )
    return values, sample


def publish_metrics(_argv: Sequence[str]) -> int:
    cfg = boot.load_config()
    if not cfg or not cfg.get("group_name") or State()["state"] != "ready":
        return 0
    url = f"http://127.0.0.1:{cfg.get('service_port', 8080)}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError as err:
        boot.log(f"no metrics from the runtime: {err}")
        return 0
    values, sample = scrape(text, boot.read_json(SAMPLE))
    boot.write_json(SAMPLE, sample)
    cloud_of(cfg).put_metrics(values)
    return 0
