"""`torchfleet-bench pipeline` (benchmarks/torchfleet_bench/pipeline.py): the CPU dry run of the
command the GPU runner calls, on the demo model, with tiny buckets and short cells."""

from __future__ import annotations

import json

import pytest
import torch
from torchfleet_bench import pipeline

pytestmark = pytest.mark.timeout(300)


def test_the_cpu_dry_run_measures_every_cell_and_says_graphs_are_unavailable(tmp_path, capsys):
    out = tmp_path / "pipeline_cpu.json"
    argv = ["--device", "cpu", "--buckets", "1,4", "--seconds", "0.05", "--batches", "2"]
    assert pipeline.main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["input_shape"] == [3, 64, 64]
    assert doc["cuda_graphs"]["enabled"] is False
    assert doc["cuda_graphs"]["reason"] == "device cpu (CUDA graphs need a CUDA replica)"
    assert list(doc["buckets"]) == ["1", "4"]
    for bucket, cell in doc["buckets"].items():
        assert cell["rows"] == {"1": 1, "4": 3}[bucket]
        assert cell["graphs"] is None and cell["worker_graphs"] is None
        for name in ("eager", "staged", "worker", "worker_ahead"):
            assert cell[name]["items_per_s"] > 0, (bucket, name)
        assert cell["assembly"]["cat_pad_us"] > 0 and cell["assembly"]["staged_us"] > 0
    printed = capsys.readouterr().out
    assert "CUDA graphs: unavailable (device cpu" in printed
    assert "assembly alone, median us" in printed


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_device_is_a_clear_error(capsys):
    assert pipeline.main(["--device", "cuda"]) == 2
    assert "--device = 'cuda' is invalid (torch sees no CUDA device); allowed: cpu" in (
        capsys.readouterr().err
    )
