"""Prometheus metrics: one registry per runtime (so tests can run several in one process).

Latencies are histograms in seconds. GPU utilisation and memory are read from NVML at scrape
time (nvidia-ml-py, the `gpu` extra), so a scrape always shows the current value and nothing
polls the driver between scrapes.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_duration = Histogram(
            "torchfleet_request_duration_seconds", "Time from a prediction request's arrival to its answer.",
            buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram(
            "torchfleet_queue_wait_seconds", "Time an instance waited in the batch queue.",
            buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram(
            "torchfleet_batch_size", "Instances per model run, before padding to a bucket.",
            buckets=BATCH_BUCKETS, registry=r)
        self.requests = Counter(
            "torchfleet_requests", "Prediction requests answered, by HTTP status code.", ["code"], registry=r)
        self.inflight = Gauge(
            "torchfleet_inflight_requests", "Prediction requests being handled now.", registry=r)
        self.queue_depth = Gauge(
            "torchfleet_queue_depth", "Instances waiting in the batch queue.", registry=r)
        self.ready = Gauge("torchfleet_ready", "1 when warmed up and not draining.", registry=r)
        self.last_request = Gauge(
            "torchfleet_last_request_timestamp_seconds",
            "Unix time of the last prediction (0 if none); the autostop role reads it.", registry=r)
        self.model_load = Gauge(
            "torchfleet_model_load_seconds", "Seconds spent loading the model.", registry=r)
        self.warmup = Gauge(
            "torchfleet_warmup_seconds", "Seconds spent sizing the batch cap and warming every bucket.",
            registry=r)
        self.batch_cap = Gauge("torchfleet_max_batch_size", "The batch cap in force.", registry=r)
        self.oom = Counter(
            "torchfleet_oom_recoveries", "Out-of-memory errors recovered from by splitting a batch.", registry=r)
        self.last_request.set(0)
        self.ready.set(0)
        gpu = GpuCollector.create()
        if gpu is not None:
            r.register(gpu)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class GpuCollector:
    """Per-GPU utilisation and memory from NVML; absent when nvidia-ml-py or a driver is missing."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    @classmethod
    def create(cls) -> GpuCollector | None:
        try:
            import pynvml  # from nvidia-ml-py
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError subclasses: no driver, no GPU
            log.debug("NVML unavailable, no GPU metrics: %s", exc)
            return None
        return cls(pynvml)

    def describe(self) -> list[Any]:
        return []  # NVML is read at scrape time; describe nothing so registration never queries it

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nv = self._nvml
        util = GaugeMetricFamily("torchfleet_gpu_utilization_ratio", "GPU busy fraction over NVML's last sample period.", labels=["gpu"])
        used = GaugeMetricFamily("torchfleet_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"])
        total = GaugeMetricFamily("torchfleet_gpu_memory_total_bytes", "GPU memory in all.", labels=["gpu"])
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                util.add_metric([str(i)], nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
                used.add_metric([str(i)], float(mem.used))
                total.add_metric([str(i)], float(mem.total))
        except Exception as exc:  # a lost GPU must not break /metrics
            log.warning("NVML query failed: %s", exc)
        yield util
        yield used
        yield total
