"""The preflight probe and the GPU textfile exporter, run as real processes on fake trees.

Both scripts ship to nodes (roles/preflight/files, roles/gpu_monitoring/files); these tests
run them with this interpreter against a fake sysfs/dev/proc/apt tree and a fake nvidia-smi,
the GPU states a CI box without a GPU cannot show.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "roles/preflight/files/torchfleet_probe.py"
EXPORTER = ROOT / "roles/gpu_monitoring/files/torchfleet_gpu_textfile.py"
MODELS = "V100,T4,A100,A100-80G,A10G,A10,L4,L40S,H100,H200"


def fake_pci(root: Path, address: str, vendor: str, klass: str, device: str) -> None:
    dev = root / "sys/bus/pci/devices" / address
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "class").write_text(klass + "\n")
    (dev / "device").write_text(device + "\n")


def fake_bin(bindir: Path, name: str, script: str) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_probe(root: Path, bindir: Path | None = None) -> dict:
    env = {"PATH": f"{bindir}:/usr/bin:/bin" if bindir else "/nonexistent"}
    out = subprocess.run(
        [
            sys.executable,
            str(PROBE),
            "--models",
            MODELS,
            "--install-root",
            str(root / "opt/x"),
            "--sysfs-root",
            str(root / "sys"),
            "--dev-root",
            str(root / "dev"),
            "--proc-root",
            str(root / "proc"),
            "--modules-root",
            str(root / "lib/modules"),
            "--apt-root",
            str(root / "etc/apt"),
            "--kernel",
            "6.1.0-18-cloud-amd64",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    return json.loads(out)


def test_probe_without_gpu_reports_none_and_reads_mirror(tmp_path: Path) -> None:
    # An Intel VGA device and NVIDIA's HDMI audio function are not NVIDIA GPUs.
    fake_pci(tmp_path, "0000:00:02.0", "0x8086", "0x030000", "0x1234")
    fake_pci(tmp_path, "0000:00:1f.1", "0x10de", "0x040300", "0x22ba")
    (tmp_path / "opt").mkdir()
    (tmp_path / "etc/apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "etc/apt/sources.list.d/debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main\n"
    )
    report = run_probe(tmp_path)
    assert report["gpu"]["present"] is False
    assert report["gpu"]["pci"] == []
    assert report["apt_mirror"] == "http://mirror.example/debian"
    assert report["kernel"]["headers_present"] is False
    # /opt/x does not exist: free disk is measured on its nearest existing parent.
    assert report["disk"]["checked_path"] == str(tmp_path / "opt")
    assert report["disk"]["free_bytes"] > 0


def test_probe_names_gpu_with_lspci_and_reads_loaded_driver(tmp_path: Path) -> None:
    fake_pci(tmp_path, "0000:00:1e.0", "0x10de", "0x030200", "0x2330")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidia0").write_text("")
    (tmp_path / "dev/nvidiactl").write_text("")
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build\n"
    )
    (tmp_path / "lib/modules/6.1.0-18-cloud-amd64/build").mkdir(parents=True)
    bindir = tmp_path / "bin"
    fake_bin(
        bindir,
        "lspci",
        'echo \'00:1e.0 "3D controller" "NVIDIA Corporation" '
        '"GH100 [H100 SXM5 80GB HBM3]" -ra1 "NVIDIA Corporation" "Device 16c1"\'\n',
    )
    report = run_probe(tmp_path, bindir)
    gpu = report["gpu"]
    assert gpu["present"] is True
    assert gpu["device_files"] == ["/dev/nvidia0"]
    assert gpu["driver_loaded_version"] == "535.104.05"
    assert [(g["device_id"], g["name"], g["model"]) for g in gpu["pci"]] == [
        ("0x2330", "GH100 [H100 SXM5 80GB HBM3]", "H100")
    ]
    assert report["kernel"]["headers_present"] is True


def test_probe_prefers_nvidia_smi_and_falls_back_without_compute_cap(tmp_path: Path) -> None:
    fake_pci(tmp_path, "0000:00:1e.0", "0x10de", "0x030200", "0x20b5")
    bindir = tmp_path / "bin"
    # An old driver refuses the compute_cap field; the probe must ask again without it.
    fake_bin(
        bindir,
        "nvidia-smi",
        'case "$1" in *compute_cap*) exit 2;; esac\n'
        'echo "NVIDIA A100-SXM4-80GB, 470.82.01, 81920, 00000000:00:1E.0"\n',
    )
    report = run_probe(tmp_path, bindir)
    (smi,) = report["gpu"]["nvidia_smi"]
    assert smi["model"] == "A100-80G"
    assert smi["compute_capability"] is None
    assert smi["driver_version"] == "470.82.01"


def test_model_matching_respects_token_boundaries() -> None:
    sys.path.insert(0, str(PROBE.parent))
    try:
        import torchfleet_probe as probe
    finally:
        sys.path.pop(0)
    models = MODELS.split(",")
    cases = {
        "NVIDIA A10G": "A10G",
        "GA102GL [A10]": "A10",
        "NVIDIA L40S": "L40S",
        "NVIDIA L4": "L4",
        "TU104GL [Tesla T4]": "T4",
        "GA100 [A100 SXM4 40GB]": "A100",
        "NVIDIA H200": "H200",
        "Device 2330": None,
    }
    assert {name: probe.match_model(name, models) for name in cases} == cases


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
