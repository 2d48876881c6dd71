"""The GPU collectors on CPU, against a fake NVML and recorded allocator readings (no GPU here;
the real ones run in test_gpu_replicas.py on a GPU machine): the exposition the alert rules,
the node agent and the HPA read, the CUDA-to-NVML index mapping, and a lost GPU that must not
break /metrics. The node agent's scrape then reads that very exposition."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from torchfleet_runtime import gpu_metrics
from torchfleet_runtime.gpu_metrics import (
    AllocatorCollector,
    NvmlCollector,
    allocator_summary,
    nvml_index,
)

from infra.bootstrap.torchfleet_agent import metrics as agent_metrics

GIB = 2**30


class FakeNvml:
    """pynvml as NVML answers on a 4-GPU node: utilisation, memory, UUIDs, the driver; a GPU in
    `lost` raises as a GPU that fell off the bus does."""

    def __init__(self, util: list[int], lost: tuple[int, ...] = ()) -> None:
        self.util, self.lost = util, lost

    def nvmlDeviceGetCount(self) -> int:
        return len(self.util)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i in self.lost:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.util[h], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=(h + 1) * GIB, total=24 * GIB, free=0)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return {"GPU-aaaa": 2, "GPU-bbbb": 3}[uuid]

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"535.183.01"


def _exposition(*collectors: object) -> str:
    registry = CollectorRegistry()
    for c in collectors:
        registry.register(c)
    return generate_latest(registry).decode()


def _value(text: str, name: str, **labels: str) -> float | None:
    """The sample `name` with exactly `labels` in an exposition, None when absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def test_nvml_gauges_label_the_gpus_that_serve_a_replica(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = FakeNvml([90, 0, 70, 0])
    devices = [torch.device("cuda", 0), torch.device("cuda", 2)]  # devices: [0, 2]
    text = _exposition(NvmlCollector(nvml, devices))
    util = "torchfleet_gpu_utilization_ratio"
    assert _value(text, util, gpu="0", device="cuda:0") == 0.9
    assert _value(text, util, gpu="1", device="") == 0.0
    assert _value(text, util, gpu="2", device="cuda:2") == 0.7
    assert _value(text, "torchfleet_gpu_memory_used_bytes", gpu="2", device="cuda:2") == 3 * GIB
    assert _value(text, "torchfleet_gpu_memory_total_bytes", gpu="3", device="") == 24 * GIB
    assert NvmlCollector(nvml, devices).driver_version() == "535.183.01"
    # what the node agent publishes for the scaling policies: the mean over GPUs 0 and 2
    values, _ = agent_metrics.scrape("torchfleet_queue_depth 3\n" + text, None, now_s=1.0)
    assert values[agent_metrics.GPU_METRIC] == (pytest.approx(80.0), "Percent")
    assert values[agent_metrics.QUEUE_METRIC] == (3.0, "Count")


def test_a_lost_gpu_leaves_metrics_answering(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    text = _exposition(NvmlCollector(FakeNvml([50, 50], lost=(1,)), [torch.device("cuda", 0)]))
    assert _value(text, "torchfleet_gpu_utilization_ratio", gpu="0", device="cuda:0") == 0.5
    assert 'gpu="1"' not in text


def test_cuda_indices_map_to_nvml_through_cuda_visible_devices():
    nvml = FakeNvml([0, 0, 0, 0])
    assert nvml_index(1, nvml, {}) == 1
    assert nvml_index(1, nvml, {"CUDA_VISIBLE_DEVICES": "2,3"}) == 3
    assert nvml_index(0, nvml, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb,GPU-aaaa"}) == 3
    assert nvml_index(2, nvml, {"CUDA_VISIBLE_DEVICES": "2,3"}) is None  # not visible
    assert nvml_index(0, nvml, {"CUDA_VISIBLE_DEVICES": "GPU-cccc"}) is None  # unknown
    assert nvml_index(0, nvml, {"CUDA_VISIBLE_DEVICES": "MIG-1234"}) is None


def test_without_nvml_or_a_driver_there_are_no_nvml_gauges(monkeypatch):
    broken = types.ModuleType("pynvml")

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert NvmlCollector.create([torch.device("cuda", 0)]) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert NvmlCollector.create([torch.device("cuda", 0)]) is None


# A reading of torch.cuda.memory_stats on a fragmented device: 14 GiB reserved, 6 of them in
# split blocks, after 3 retries and 1 OOM.
STATS = {
    gpu_metrics.ALLOCATED: 7 * GIB,
    gpu_metrics.RESERVED: 14 * GIB,
    gpu_metrics.INACTIVE_SPLIT: 6 * GIB,
    gpu_metrics.RETRIES: 3,
    gpu_metrics.OOMS: 1,
}


def test_allocator_summary_reads_fragmentation_and_the_reserved_share():
    s = allocator_summary(STATS, 20 * GIB)
    assert s["fragmentation"] == pytest.approx(6 / 14, abs=1e-4)
    assert s["reserved_share"] == pytest.approx(0.7)
    assert (s["alloc_retries"], s["ooms"], s["allocated_bytes"]) == (3, 1, 7 * GIB)
    empty = allocator_summary({}, 20 * GIB)
    assert empty["fragmentation"] == 0.0 and empty["reserved_share"] == 0.0


def test_allocator_metrics_per_replica_and_a_lost_device_skipped(monkeypatch):
    def reading(device: torch.device) -> dict:
        if device.index == 1:
            raise RuntimeError("CUDA error: unspecified launch failure")
        return allocator_summary(STATS, 20 * GIB)

    monkeypatch.setattr(gpu_metrics, "device_memory", reading)
    devices = [torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")]
    text = _exposition(AllocatorCollector(devices, 0.7))
    want = {
        "torchfleet_cuda_memory_reserved_bytes": 14 * GIB,
        "torchfleet_cuda_memory_inactive_split_bytes": 6 * GIB,
        "torchfleet_cuda_memory_allocated_bytes": 7 * GIB,
        "torchfleet_cuda_memory_total_bytes": 20 * GIB,
        "torchfleet_cuda_alloc_retries_total": 3,
        "torchfleet_cuda_ooms_total": 1,
        "torchfleet_memory_fraction": 0.7,
    }
    for name, value in want.items():
        assert _value(text, name, device="cuda:0") == value, name
    assert "cuda:1" not in text and 'device="cpu"' not in text
