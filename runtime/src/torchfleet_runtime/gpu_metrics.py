"""GPU metrics read at scrape time: NVML (the whole GPU) and the CUDA caching allocator (this
process's memory on each replica's device). Nothing polls between scrapes.

Contract (names are what dashboards and alert rules read):
- `NvmlCollector` (nvidia-ml-py, the `gpu` extra; absent without it or without a driver):
  `torchfleet_gpu_utilization_ratio`, `torchfleet_gpu_memory_used_bytes`,
  `torchfleet_gpu_memory_total_bytes`, labelled `gpu` (NVML's index, nvidia-smi's) and `device`
  (cuda:N when a replica of this process runs on that GPU, else empty). `serve` sets
  CUDA_DEVICE_ORDER=PCI_BUS_ID unless the environment says otherwise, so CUDA's numbering is
  NVML's, narrowed by CUDA_VISIBLE_DEVICES (indices or GPU UUIDs).
- `AllocatorCollector` (CUDA replicas only), per replica `device`, from
  torch.cuda.memory_stats: `torchfleet_cuda_memory_allocated_bytes` (held by tensors),
  `torchfleet_cuda_memory_reserved_bytes` (held by the allocator: allocated + cached),
  `torchfleet_cuda_memory_inactive_split_bytes` (cached in blocks that were split: free, but
  only for requests that fit the pieces: the fragmentation), `torchfleet_cuda_memory_total_bytes`,
  `torchfleet_cuda_alloc_retries_total` (cudaMalloc failed, the cache was flushed and the
  allocation retried: a synchronising stall on the request path),
  `torchfleet_cuda_ooms_total` (allocations that failed even after that), and
  `torchfleet_memory_fraction` (the share of the device the batch cap was sized to).
  `allocator_summary(stats)` is the same reading as one dict (/v1/model, `diagnose`).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterator, Mapping, Sequence

import torch
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

# torch.cuda.memory_stats keys (torch 1.12 and 2.x name them alike)
ALLOCATED = "allocated_bytes.all.current"
RESERVED = "reserved_bytes.all.current"
INACTIVE_SPLIT = "inactive_split_bytes.all.current"
RETRIES = "num_alloc_retries"
OOMS = "num_ooms"


def allocator_summary(stats: Mapping[str, Any], total: int) -> dict[str, Any]:
    """The allocator's figures that point at memory trouble, from one memory_stats() reading:
    bytes allocated / reserved / in inactive split blocks / total, the retry and OOM counts, and
    two ratios: `fragmentation` (inactive split / reserved: cached memory a large tensor cannot
    use) and `reserved_share` (reserved / the device's total)."""
    reserved = int(stats.get(RESERVED, 0))
    split = int(stats.get(INACTIVE_SPLIT, 0))
    return {
        "allocated_bytes": int(stats.get(ALLOCATED, 0)),
        "reserved_bytes": reserved,
        "inactive_split_bytes": split,
        "total_bytes": int(total),
        "alloc_retries": int(stats.get(RETRIES, 0)),
        "ooms": int(stats.get(OOMS, 0)),
        "fragmentation": round(split / reserved, 4) if reserved else 0.0,
        "reserved_share": round(reserved / total, 4) if total else 0.0,
    }


def device_memory(device: torch.device) -> dict[str, Any]:
    """allocator_summary for one CUDA device of this process."""
    total = int(torch.cuda.get_device_properties(device).total_memory)
    return allocator_summary(torch.cuda.memory_stats(device), total)


class AllocatorCollector:
    def __init__(self, devices: Sequence[torch.device], memory_fraction: float) -> None:
        self._devices = [d for d in devices if d.type == "cuda"]
        self._fraction = memory_fraction

    def describe(self) -> list[Any]:
        return []  # read at scrape time; registration must not touch CUDA

    def collect(self) -> Iterator[Any]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["device"])

        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "allocated_bytes": gauge(
                "torchfleet_cuda_memory_allocated_bytes", "CUDA memory held by tensors."
            ),
            "reserved_bytes": gauge(
                "torchfleet_cuda_memory_reserved_bytes",
                "CUDA memory held by the caching allocator (allocated + cached).",
            ),
            "inactive_split_bytes": gauge(
                "torchfleet_cuda_memory_inactive_split_bytes",
                "Cached CUDA memory in split blocks (usable only by requests that fit the pieces).",
            ),
            "total_bytes": gauge("torchfleet_cuda_memory_total_bytes", "The device's memory."),
            "alloc_retries": CounterMetricFamily(
                "torchfleet_cuda_alloc_retries",
                "cudaMalloc failures retried after flushing the allocator's cache.",
                labels=["device"],
            ),
            "ooms": CounterMetricFamily(
                "torchfleet_cuda_ooms",
                "CUDA allocations that failed after a retry (out of memory).",
                labels=["device"],
            ),
        }
        fraction = gauge(
            "torchfleet_memory_fraction", "Share of the device the batch cap was sized to."
        )
        for device in self._devices:
            label = f"cuda:{device.index or 0}"
            try:
                summary = device_memory(device)
            except Exception as exc:  # a lost GPU must not break /metrics
                log.warning("CUDA memory stats of %s failed: %s", label, exc)
                continue
            for key, family in families.items():
                family.add_metric([label], float(summary[key]))
            fraction.add_metric([label], self._fraction)
        yield from families.values()
        yield fraction


def nvml_index(cuda_index: int, nvml: Any, env: Mapping[str, str] | None = None) -> int | None:
    """NVML's index of CUDA device `cuda_index` of this process (module doc), None if unknown."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return cuda_index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if cuda_index >= len(entries):
        return None
    entry = entries[cuda_index]
    if entry.isdigit():
        return int(entry)
    if entry.startswith("GPU-"):
        try:
            return int(nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(entry)))
        except Exception:  # an unknown or partial UUID, a MIG instance
            return None
    return None


class NvmlCollector:
    """Per-GPU utilisation and memory from NVML; absent when nvidia-ml-py or a driver is missing."""

    def __init__(self, nvml: Any, devices: Sequence[torch.device] = ()) -> None:
        self._nvml = nvml
        self._device_of: dict[int, str] = {}
        for d in devices:
            if d.type == "cuda":
                i = nvml_index(d.index or 0, nvml)
                if i is not None:
                    self._device_of[i] = f"cuda:{d.index or 0}"

    @classmethod
    def create(cls, devices: Sequence[torch.device] = ()) -> NvmlCollector | None:
        try:
            import pynvml  # from nvidia-ml-py
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError subclasses: no driver, no GPU
            log.debug("NVML unavailable, no GPU metrics: %s", exc)
            return None
        return cls(pynvml, devices)

    def describe(self) -> list[Any]:
        return []  # NVML is read at scrape time; describe nothing so registration never queries it

    def collect(self) -> Iterator[GaugeMetricFamily]:
        nv = self._nvml
        labels = ["gpu", "device"]
        util = GaugeMetricFamily(
            "torchfleet_gpu_utilization_ratio",
            "GPU busy fraction over NVML's last sample period.",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "torchfleet_gpu_memory_used_bytes", "GPU memory in use.", labels=labels
        )
        total = GaugeMetricFamily(
            "torchfleet_gpu_memory_total_bytes", "GPU memory in all.", labels=labels
        )
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                key = [str(i), self._device_of.get(i, "")]
                util.add_metric(key, nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
                used.add_metric(key, float(mem.used))
                total.add_metric(key, float(mem.total))
        except Exception as exc:  # a lost GPU must not break /metrics
            log.warning("NVML query failed: %s", exc)
        yield util
        yield used
        yield total

    def driver_version(self) -> str | None:
        try:
            v = self._nvml.nvmlSystemGetDriverVersion()
        except Exception:
            return None
        return v.decode() if isinstance(v, bytes) else str(v)


def register(registry: Any, devices: Sequence[torch.device], memory_fraction: float) -> Any:
    """Register the GPU collectors that apply to `devices`; returns the NVML one (or None)."""
    nvml = NvmlCollector.create(devices)
    if nvml is not None:
        registry.register(nvml)
    if any(d.type == "cuda" for d in devices):
        registry.register(AllocatorCollector(devices, memory_fraction))
    return nvml
