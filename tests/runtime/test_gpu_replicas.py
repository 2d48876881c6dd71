"""The multi-GPU path on real GPUs: one replica per visible GPU (`devices: all`), each warm and
serving, its allocator and NVML signals on /metrics under its own `device` label, every GPU
taking batches under load, `devices: [0]` serving on GPU 0 alone, and `diagnose` reading the
allocator's memory. Skipped without CUDA (the two-GPU tests without two GPUs), never faked:
the same mechanism is proven on CPU replicas in test_replicas.py. `scripts/gpu_check.sh` runs
these on a lent GPU machine."""

from __future__ import annotations

import json
import threading

import pytest
import rt_models
import torch
from rt_helpers import Client, metric_value
from torchfleet_runtime.cli import main

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device"),
    pytest.mark.timeout(300),
]
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices")
LABELS = [f"cuda:{i}" for i in range(GPUS)]


def x4(v: float) -> list[float]:
    return [v, v + 1, v + 2, v + 3]


def _load(port: int, requests: int, clients: int = 8) -> list[int]:
    """Bounded closed-loop load: `clients` threads, `requests` each; their status codes."""
    codes: list[int] = []

    def one(k: int) -> None:
        c = Client(port)
        for i in range(requests):
            codes.append(c.predict(x4(float((k + i) % 5)))[0])
        c.close()

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return codes


def test_every_gpu_gets_a_warm_replica_with_its_own_metrics(start_runtime, client_for):
    rt = start_runtime(rt_models.tiny(), device="cuda", devices="all", max_batch_size=8)
    status, ready = client_for(rt).get_json("/readyz")
    assert status == 200, ready
    card = client_for(rt).get_json("/v1/model")[1]
    assert [(r["device"], r["state"]) for r in card["replicas"]] == [
        (label, "serving") for label in LABELS
    ]
    for r in card["replicas"]:
        mem = r["memory"]
        assert mem["reserved_bytes"] >= mem["allocated_bytes"] > 0, r
        assert 0 < mem["reserved_share"] < 1 and 0 <= mem["fragmentation"] <= 1, r
    codes = _load(rt.port, requests=40)
    assert codes and set(codes) == {200}
    text = rt.runtime.metrics_text().decode()
    for label in LABELS:
        on = f'device="{label}"'
        assert metric_value(text, "torchfleet_replica_ready", on) == 1
        assert metric_value(text, "torchfleet_cuda_memory_reserved_bytes", on) > 0
        assert metric_value(text, "torchfleet_cuda_memory_total_bytes", on) > 0
        assert metric_value(text, "torchfleet_memory_fraction", on) == pytest.approx(0.7)
        assert f"torchfleet_cuda_alloc_retries_total{{{on}}}" in text
    try:
        import pynvml  # noqa: F401 (the runtime's gpu extra)
    except ImportError:
        return
    assert text.count("torchfleet_gpu_utilization_ratio{") >= GPUS
    for label in LABELS:
        assert f'device="{label}"' in "".join(
            line for line in text.splitlines() if line.startswith("torchfleet_gpu_utilization")
        )


@needs_two_gpus
def test_load_reaches_every_gpu(start_runtime, client_for):
    rt = start_runtime(rt_models.tiny(), device="cuda", devices="all", max_batch_size=4)
    codes = _load(rt.port, requests=100, clients=16)
    assert set(codes) == {200}
    text = rt.runtime.metrics_text().decode()
    for label in LABELS:
        assert metric_value(text, "torchfleet_batch_size_count", f'device="{label}"') >= 1, label
        assert metric_value(text, "torchfleet_replica_busy_seconds_total", f'device="{label}"') > 0


@needs_two_gpus
def test_a_device_list_serves_on_the_named_gpus_only(start_runtime, client_for):
    rt = start_runtime(rt_models.tiny(), device="cuda", devices=((0,),), max_batch_size=4)
    card = client_for(rt).get_json("/v1/model")[1]
    assert [r["device"] for r in card["replicas"]] == ["cuda:0"]
    assert set(_load(rt.port, requests=10, clients=2)) == {200}
    text = rt.runtime.metrics_text().decode()
    assert metric_value(text, "torchfleet_replica_ready", 'device="cuda:1"') == 0
    assert 'torchfleet_cuda_memory_reserved_bytes{device="cuda:1"}' not in text


def test_diagnose_reads_the_allocator_of_every_gpu(start_runtime, capsys):
    rt = start_runtime(rt_models.tiny(), device="cuda", devices="all", max_batch_size=4)
    _load(rt.port, requests=10, clients=2)
    assert (
        main(["diagnose", "--url", f"http://127.0.0.1:{rt.port}", "--window", "0", "--json"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert [r["device"] for r in doc["replicas"]] == LABELS
    for r in doc["replicas"]:
        assert r["memory"]["reserved_bytes"] > 0 and r["memory_fraction"] == pytest.approx(0.7)
    assert doc["versions"]["cuda"] == torch.version.cuda
