"""Prometheus metrics: one registry per runtime (so tests can run several in one process).

The names are a contract (dashboards and alert rules are written against them). Latencies are
histograms in seconds. `torchfleet_stage_duration_seconds{stage}`: decode, queue, encode and
write once per prediction, model once per batch run (the forward with its pad and split; it
replaces the former torchfleet_queue_wait_seconds with stage="queue").
`torchfleet_model_info{model_version, model_name, format, device, precision}` is 1 for the model
being served (one series; a reload replaces it). The standard `process_*` metrics (CPU seconds,
resident memory, open fds) come from prometheus-client's process collector. GPU utilisation
and memory are read from NVML at scrape
time (nvidia-ml-py, the `gpu` extra), so a scrape always shows the current value and nothing
polls the driver between scrapes.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Stages run from microseconds (decode of a binary body) to seconds (a big batch on CPU).
STAGE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)
DIFF_BUCKETS = (1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 100.0)
STAGES = ("decode", "queue", "model", "encode", "write")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_duration = Histogram(
            "torchfleet_request_duration_seconds",
            "Time from a prediction request's arrival to its answer.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "torchfleet_stage_duration_seconds",
            "Time per stage: decode, queue, encode, write per prediction; model per batch run.",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        # Children resolved once: .labels() is a dict lookup under a lock on every call.
        self.stage_of = {s: self.stage.labels(stage=s) for s in STAGES}
        self.model_info = Gauge(
            "torchfleet_model_info",
            "1 for the model being served.",
            ["model_version", "model_name", "format", "device", "precision"],
            registry=r,
        )
        self.spot_notice = Gauge(
            "torchfleet_spot_interruption_notice",
            "1 once a spot interruption notice has been seen.",
            registry=r,
        )
        self.reloads = Counter(
            "torchfleet_reloads", "Model reloads by result (ok, failed).", ["result"], registry=r
        )
        for result in ("ok", "failed"):
            self.reloads.labels(result=result)
        self.connections = Gauge(
            "torchfleet_open_connections", "HTTP connections open now.", registry=r
        )
        self.batch_size = Histogram(
            "torchfleet_batch_size",
            "Instances per model run, before padding to a bucket.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "torchfleet_requests",
            "Prediction requests answered, by HTTP status code.",
            ["code"],
            registry=r,
        )
        self.inflight = Gauge(
            "torchfleet_inflight_requests", "Prediction requests being handled now.", registry=r
        )
        self.queue_depth = Gauge(
            "torchfleet_queue_depth", "Instances waiting in the batch queue.", registry=r
        )
        self.ready = Gauge("torchfleet_ready", "1 when warmed up and not draining.", registry=r)
        self.last_request = Gauge(
            "torchfleet_last_request_timestamp_seconds",
            "Unix time of the last prediction (0 if none); the autostop role reads it.",
            registry=r,
        )
        self.model_load = Gauge(
            "torchfleet_model_load_seconds", "Seconds spent loading the model.", registry=r
        )
        self.warmup = Gauge(
            "torchfleet_warmup_seconds",
            "Seconds spent sizing the batch cap and warming every bucket.",
            registry=r,
        )
        self.batch_cap = Gauge("torchfleet_max_batch_size", "The batch cap in force.", registry=r)
        self.torch_threads = Gauge(
            "torchfleet_torch_threads",
            "Torch intra-op threads the model runs with now (auto: chosen under load).",
            registry=r,
        )
        self.oom = Counter(
            "torchfleet_oom_recoveries",
            "Out-of-memory errors recovered from by splitting a batch.",
            registry=r,
        )
        self._shadow_metrics(r)
        self.last_request.set(0)
        self.ready.set(0)
        self.spot_notice.set(0)
        self._info_labels: tuple[str, ...] | None = None
        # process_cpu_seconds_total, process_resident_memory_bytes, ...: the runtime's own cost
        ProcessCollector(registry=r)
        gpu = GpuCollector.create()
        if gpu is not None:
            r.register(gpu)

    def _shadow_metrics(self, r: CollectorRegistry) -> None:
        """Shadow testing (shadow.py), by the candidate's model_version: requests by result
        (compared, error, mismatch, dropped_load, dropped_busy, dropped_not_ready); instances
        compared, of which argmax agreed, and the summed top-k overlap (divide by instances);
        the largest absolute output difference per request; model seconds of both sides."""
        v = ["model_version"]
        self.shadow_loads = Counter(
            "torchfleet_shadow_loads", "Shadow candidate loads by result.", ["result"], registry=r
        )
        self.shadow_requests = Counter(
            "torchfleet_shadow_requests",
            "Sampled requests offered to the shadow candidate, by result.",
            [*v, "result"],
            registry=r,
        )
        self.shadow_instances = Counter(
            "torchfleet_shadow_instances", "Instances compared with the candidate.", v, registry=r
        )
        self.shadow_argmax_agreements = Counter(
            "torchfleet_shadow_argmax_agreements",
            "Compared instances whose argmax agreed.",
            v,
            registry=r,
        )
        self.shadow_topk_overlap = Counter(
            "torchfleet_shadow_topk_overlap",
            "Sum over compared instances of the shared share of the top-k classes.",
            v,
            registry=r,
        )
        self.shadow_max_abs_diff = Histogram(
            "torchfleet_shadow_max_abs_diff",
            "Largest absolute difference of a compared request's outputs.",
            v,
            buckets=DIFF_BUCKETS,
            registry=r,
        )
        self.shadow_duration = Histogram(
            "torchfleet_shadow_duration_seconds",
            "Model seconds of a compared request, on the candidate and on the live model.",
            [*v, "model"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def set_model(self, version: str, name: str, format: str, device: str, precision: str) -> None:
        """The model being served: replaces the one info series (a reload swaps the labels)."""
        labels = (version, name, format, device, precision)
        if self._info_labels is not None and self._info_labels != labels:
            self.model_info.remove(*self._info_labels)
        self.model_info.labels(*labels).set(1)
        self._info_labels = labels


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
        util = GaugeMetricFamily(
            "torchfleet_gpu_utilization_ratio",
            "GPU busy fraction over NVML's last sample period.",
            labels=["gpu"],
        )
        used = GaugeMetricFamily(
            "torchfleet_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"]
        )
        total = GaugeMetricFamily(
            "torchfleet_gpu_memory_total_bytes", "GPU memory in all.", labels=["gpu"]
        )
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
