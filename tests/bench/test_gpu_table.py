"""`torchfleet-bench gpu` (the table scripts/gpu_check.sh prints on a GPU machine) in miniature
over CPU "devices": real serve processes for each variant, the sizing read back from the
runtime, the ratios computed, fp16 marked skipped off CUDA. Its figures here mean nothing for a
GPU; this proves the tool runs, so a lent GPU machine is not spent debugging it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

needs_two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="the `all` variant needs two usable CPUs"
)


@needs_two_cpus
@pytest.mark.timeout(300)
def test_gpu_table_runs_every_variant_on_cpu_devices(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchfleet_bench",
            "gpu",
            "--device",
            "cpu",
            "--seconds",
            "0.5",
            "--concurrency",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    res = doc["results"]
    n = len(os.sched_getaffinity(0))
    assert doc["devices"] == n
    assert res["fp16"] == {"skipped": "not on cpu"}
    assert res["one"]["replicas"] == 1 and res["all"]["replicas"] == n
    assert res["no-batching"]["max_batch_size"] == 1
    assert res["no-batching"]["batch_cap_method"] == "configured"
    for name in ("one", "all", "no-batching"):
        assert res[name]["rps"] > 0 and not res[name]["errors"], (name, res[name])
    assert set(doc["ratios"]) == {f"scaling efficiency all / ({n} x one)", "batching on / off"}
    want = round(res["all"]["rps"] / (n * res["one"]["rps"]), 3)
    assert doc["ratios"][f"scaling efficiency all / ({n} x one)"] == want
    assert "variant" in proc.stdout and "skipped: not on cpu" in proc.stdout


def test_unknown_variants_are_named(capsys):
    from torchfleet_bench import gpu

    with pytest.raises(SystemExit):
        gpu.main(["--device", "cpu", "--variants", "one,fp8"])
    assert "--variants = 'fp8' is invalid; allowed: one, all, fp16, no-batching" in (
        capsys.readouterr().err
    )
