"""The GPU textfile exporter (roles/gpu_monitoring/files), run for real against a fake
nvidia-smi: the GPU states a CI box without a GPU cannot show."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = ROOT / "roles/gpu_monitoring/files/torchfleet_gpu_textfile.py"


def fake_bin(bindir: Path, name: str, script: str) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_exporter(tmp_path: Path, smi_script: str) -> tuple[int, str]:
    fake_bin(tmp_path / "bin", "nvidia-smi", smi_script)
    out_dir = tmp_path / "textfile"
    out_dir.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            str(EXPORTER),
            "--output-dir",
            str(out_dir),
            "--nvidia-smi",
            str(tmp_path / "bin/nvidia-smi"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    # Written atomically: no temporary file may be left behind.
    assert sorted(os.listdir(out_dir)) == ["torchfleet_gpu.prom"]
    return done.returncode, (out_dir / "torchfleet_gpu.prom").read_text()


def test_exporter_writes_gpu_metrics(tmp_path: Path) -> None:
    rc, text = run_exporter(
        tmp_path,
        (
            'echo "0, GPU-a, NVIDIA H100 80GB HBM3, 535.104.05, 37, 12, 20480, 81559, 41, 98.52, '
            '700.00, 0, 2, 0x0000000000000044"\n'
            'echo "1, GPU-b, NVIDIA H100 80GB HBM3, 535.104.05, [N/A], 0, 0, 81559, 35, [N/A], '
            '700.00, [N/A], [N/A], [Not Supported]"\n'
        ),
    )
    assert rc == 0
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    p = "torchfleet_node_gpu_"
    assert samples[p + "scrape_success"] == "1"
    assert float(samples[p + 'utilization_ratio{gpu="0"}']) == 0.37
    assert p + 'utilization_ratio{gpu="1"}' not in samples  # [N/A] is left out, not 0
    assert float(samples[p + 'memory_used_bytes{gpu="0"}']) == 20480 * 1024 * 1024
    assert float(samples[p + 'ecc_uncorrected_errors{gpu="0"}']) == 2
    # 0x44 = sw_power_cap (0x4) + hw_thermal_slowdown (0x40)
    active = sorted(
        k for k, v in samples.items() if k.startswith(p + "throttle_reason") and v == "1"
    )
    assert active == [
        p + 'throttle_reason{gpu="0",reason="hw_thermal_slowdown"}',
        p + 'throttle_reason{gpu="0",reason="sw_power_cap"}',
    ]


def test_exporter_reports_a_failed_nvidia_smi(tmp_path: Path) -> None:
    rc, text = run_exporter(tmp_path, "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert rc == 1
    assert "torchfleet_node_gpu_scrape_success 0" in text.splitlines()
    assert "utilization_ratio" not in text
