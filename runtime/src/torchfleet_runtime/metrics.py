"""Prometheus metrics: one registry per runtime (so tests can run several in one process).

The names are a contract (dashboards and alert rules are written against them). Latencies are
histograms in seconds. `torchfleet_request_duration_seconds` uses torchfleet_compat's
LATENCY_BOUNDS (each bound at most 20 % above the one below from 5 ms to 5 s, coarse outside),
which the rollout's guards and the node agent read it with: it costs one series per bound, +Inf,
_sum, _count and _created per route (50, where the coarser buckets before it
took 18: tests/rollout/test_policy.py counts them). `torchfleet_requests_total{code, route}` and
the latency histogram carry the prediction's `route` (v2.ROUTE_LABELS: `/v1/predict` or the
template `/v2/models/:model/infer`, never a raw path or a model's name), so /v1 and /v2 traffic
are told apart and a sum over `route` is the node's total. The /v1 route's latency series are
there from the start (as the unlabelled histogram's were: a node's bucket bounds can be read
before it answers), /v2's with its first request. `torchfleet_capacity_items_per_second`: the
instances per second the node sustains with batches up to its cap (Batcher.capacity), beside
`torchfleet_max_batch_size`; both change on a reload or a lowered cap.

What one model replica does carries its `device` label (placement.py: cuda:0, cpu, cpu:1,
cpu:0-1): `torchfleet_stage_duration_seconds{stage, device}` (decode,
queue, encode and write once per prediction, labelled with the replica that ran it; model once
per batch run: the forward with its pad and split), `torchfleet_batch_size{device}`,
`torchfleet_torch_threads{device}`, `torchfleet_oom_recoveries_total{device}`,
`torchfleet_replica_ready{device}` (1 while the replica serves, 0 once it failed) and
`torchfleet_replica_busy_seconds_total{device}` (its rate is the replica's busy fraction, on CPU
and GPU alike). The queue, the batch cap and the requests are the node's: one queue feeds every
replica. `torchfleet_model_info{model_version, model_name, format, device, precision}` is 1 for
the model being served (one series; `device` lists the replicas; a reload replaces it). The
standard `process_*` metrics (CPU seconds, resident memory, open fds) come from
prometheus-client's process collector. GPU figures (NVML, the CUDA caching allocator) are read
at scrape time by gpu_metrics.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from torchfleet_compat.histogram import LATENCY_BOUNDS

from .v2 import V1_ROUTE

log = logging.getLogger(__name__)

# Each bound at most 20 % above the one below from 5 ms to 5 s (torchfleet_compat.histogram, which
# the rollout's guards read them with): a p99 moved by that ratio reads as moved.
LATENCY_BUCKETS = LATENCY_BOUNDS
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


@dataclass(frozen=True)
class DeviceMetrics:
    """One replica's metric children, resolved once (.labels() takes a lock on every call)."""

    stage: dict[str, Any]
    batch_size: Any
    torch_threads: Any
    oom: Any
    ready: Any
    busy: Any


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.request_duration = Histogram(
            "torchfleet_request_duration_seconds",
            "Time from a prediction request's arrival to its answer, by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "torchfleet_stage_duration_seconds",
            "Time per stage: decode, queue, encode, write per prediction; model per batch run.",
            ["stage", "device"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
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
        self.edge_workers = Gauge(
            "torchfleet_edge_workers",
            "HTTP edge processes in front of the model owner (0: the edge runs in the owner).",
            registry=r,
        )
        self.edge_restarts = Counter(
            "torchfleet_edge_restarts",
            "Edge processes that exited and were started again.",
            registry=r,
        )
        self.edge_memory = Gauge(
            "torchfleet_edge_resident_memory_bytes",
            "Resident memory of each edge process, as it last reported.",
            ["edge"],
            registry=r,
        )
        self.batch_size = Histogram(
            "torchfleet_batch_size",
            "Instances per model run, before padding to a bucket.",
            ["device"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "torchfleet_requests",
            "Prediction requests answered, by HTTP status code and route.",
            ["code", "route"],
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
        self.capacity = Gauge(
            "torchfleet_capacity_items_per_second",
            "Instances per second the node sustains with batches up to its cap (the best rate of "
            "warm-up's fastest runs, summed over the replicas); 0 when not timed.",
            registry=r,
        )
        self.torch_threads = Gauge(
            "torchfleet_torch_threads",
            "Torch intra-op threads the replica runs with now (auto: chosen under load).",
            ["device"],
            registry=r,
        )
        self.oom = Counter(
            "torchfleet_oom_recoveries",
            "Out-of-memory errors recovered from by splitting a batch.",
            ["device"],
            registry=r,
        )
        self.replica_ready = Gauge(
            "torchfleet_replica_ready",
            "1 while the model replica on this device serves, 0 once it has failed.",
            ["device"],
            registry=r,
        )
        self.replica_busy = Counter(
            "torchfleet_replica_busy_seconds",
            "Seconds the replica on this device spent running batches.",
            ["device"],
            registry=r,
        )
        self.degraded = Gauge(
            "torchfleet_degraded",
            "1 while some model replica has failed (the node serves on fewer devices).",
            registry=r,
        )
        self._shadow_metrics(r)
        self.last_request.set(0)
        self.ready.set(0)
        self.spot_notice.set(0)
        self.degraded.set(0)
        self._info_labels: tuple[str, ...] | None = None
        self._devices: dict[str, DeviceMetrics] = {}
        self._answered: dict[tuple[str, int], Any] = {}
        self._latency: dict[str, Any] = {}
        self.latency(V1_ROUTE)  # /v1's series from the start (the module docstring)
        # process_cpu_seconds_total, process_resident_memory_bytes, ...: the runtime's own cost
        ProcessCollector(registry=r)

    def device(self, label: str) -> DeviceMetrics:
        """The metric children of the replica on `label` (made on first use)."""
        found = self._devices.get(label)
        if found is None:
            found = self._devices[label] = DeviceMetrics(
                {s: self.stage.labels(stage=s, device=label) for s in STAGES},
                self.batch_size.labels(device=label),
                self.torch_threads.labels(device=label),
                self.oom.labels(device=label),
                self.replica_ready.labels(device=label),
                self.replica_busy.labels(device=label),
            )
        return found

    def answered(self, route: str, code: int) -> Any:
        """The request counter's child for `route` and `code` (made on first use: .labels()
        takes a lock and costs more than the increment on every call)."""
        found = self._answered.get((route, code))
        if found is None:
            found = self._answered[(route, code)] = self.requests.labels(str(code), route)
        return found

    def latency(self, route: str) -> Any:
        """The request-latency histogram's child for `route` (made on first use)."""
        found = self._latency.get(route)
        if found is None:
            found = self._latency[route] = self.request_duration.labels(route=route)
        return found

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

    def set_cap(self, cap: int, capacity: float | None) -> None:
        """The batch cap in force and the instances per second it sustains (None: not timed)."""
        self.batch_cap.set(cap)
        self.capacity.set(capacity or 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def set_model(self, version: str, name: str, format: str, device: str, precision: str) -> None:
        """The model being served: replaces the one info series (a reload swaps the labels)."""
        labels = (version, name, format, device, precision)
        if self._info_labels is not None and self._info_labels != labels:
            self.model_info.remove(*self._info_labels)
        self.model_info.labels(*labels).set(1)
        self._info_labels = labels
