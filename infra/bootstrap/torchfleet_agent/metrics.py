"""The metrics a ready group node publishes every 15 s (torchfleet-metrics.timer), read from
the runtime's /metrics: for scaling, QueueDepth, GpuUtilization (when NVML reports: the
runtime's `gpu` extra, which the inference_runtime role installs on GPU nodes) and RequestRate;
for a rollout's guards on Alibaba (infra/rollout/signals.py's CloudMonitorSource: the CLB's own
figures are per listener, the same for both tracks), what the node answered since its last
sample: RequestCount, ErrorCount (5xx) and LatencyP99 (seconds, the p99 of those requests from
the latency histogram's growth: torchfleet_compat.histogram). Each node serves one track, and its
metrics carry its scaling group, so a group's figures are its track's. The interval metrics
need a previous sample of the same runtime: none after a restart (the counters went down)."""

from __future__ import annotations

import time
from typing import Any, Sequence

from torchfleet_compat.histogram import growth, quantile

from . import boot
from .cloud import Metrics, cloud_of
from .local import open_runtime
from .state import State

SAMPLE = "/run/torchfleet/metrics-sample.json"  # the last request count, for RequestRate
# The names the scaling policies and alarms read (infra/nodeboot.py imports them).
QUEUE_METRIC = "QueueDepth"  # instances waiting in the runtime's batch queue
GPU_METRIC = "GpuUtilization"  # percent, mean over the GPUs that serve a replica
REQUEST_METRIC = "RequestRate"  # requests/s answered (Alibaba only: AWS has the ALB's count)
# Since the last sample (Alibaba only: AWS's ALB has them per target group). infra/rollout reads
# them by these names.
REQUEST_COUNT_METRIC = "RequestCount"
ERROR_COUNT_METRIC = "ErrorCount"  # answers with a 5xx code
LATENCY_P99_METRIC = "LatencyP99"  # seconds
ALIBABA_ONLY = (REQUEST_METRIC, REQUEST_COUNT_METRIC, ERROR_COUNT_METRIC, LATENCY_P99_METRIC)


def scrape(
    text: str, previous: dict[str, Any] | None = None, now_s: float | None = None
) -> tuple[Metrics, dict[str, Any]]:
    """QueueDepth (instances waiting), GpuUtilization (percent, mean over the GPUs that serve a
    model replica: those with a `device` label; every GPU when none has one, as runtimes before
    replicas wrote it) and, since `previous` (the last sample {"t", "requests", "errors",
    "buckets"}), RequestRate (requests answered per second), RequestCount, ErrorCount and
    LatencyP99 (when requests were answered). Returns (values, sample)."""
    queue, gpus, serving, requests, errors = 0.0, [], [], 0.0, 0.0
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("torchfleet_queue_depth "):
            queue = float(line.split()[1])
        elif line.startswith("torchfleet_gpu_utilization_ratio{"):
            value = float(line.rsplit(" ", 1)[1])
            gpus.append(value)
            if 'device="cuda' in line:
                serving.append(value)
        elif line.startswith("torchfleet_requests_total{"):
            value = float(line.rsplit(" ", 1)[1])
            requests += value
            if 'code="5' in line:
                errors += value
        elif line.startswith("torchfleet_request_duration_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    values: Metrics = {QUEUE_METRIC: (queue, "Count")}
    busy = serving or gpus
    if busy:
        values[GPU_METRIC] = (100.0 * sum(busy) / len(busy), "Percent")
    sample = {
        "t": time.time() if now_s is None else now_s,
        "requests": requests,
        "errors": errors,
        "buckets": sorted(buckets.items()),  # JSON has no float keys
    }
    # a lower count than last time: the runtime restarted, nothing to compare with
    if previous and sample["t"] > previous["t"] and requests >= previous["requests"]:
        answered = requests - previous["requests"]
        values[REQUEST_METRIC] = (answered / (sample["t"] - previous["t"]), "Count/Second")
        values[REQUEST_COUNT_METRIC] = (answered, "Count")
        values[ERROR_COUNT_METRIC] = (errors - previous.get("errors", errors), "Count")
        before = {float(le): c for le, c in previous.get("buckets") or []}
        p99 = quantile(0.99, growth(buckets, before)) if answered and before else None
        if p99 is not None:
            values[LATENCY_P99_METRIC] = (p99, "Seconds")
    return values, sample


def publish_metrics(_argv: Sequence[str]) -> int:
    cfg = boot.load_config()
    if not cfg or not cfg.get("group_name") or State()["state"] != "ready":
        return 0
    try:
        with open_runtime(cfg, "/metrics") as resp:
            text = resp.read().decode()
    except OSError as err:
        boot.log(f"no metrics from the runtime: {err}")
        return 0
    values, sample = scrape(text, boot.read_json(SAMPLE))
    boot.write_json(SAMPLE, sample)
    cloud_of(cfg).put_metrics(values)
    return 0
