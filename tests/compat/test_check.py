"""`torchfleet-runtime check`: the pure comparisons, the judge of an installed node's facts
against a matrix (GPU hosts simulated by facts, since this machine has none), the probe on this
machine, and real runs of the runtime's CLI, which calls torchfleet_compat.check."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from torchfleet_compat import check as check_cli
from torchfleet_compat import matrix as compat
from torchfleet_compat import probe
from torchfleet_compat.check import CheckError
from torchfleet_compat.judge import SKIP, Options, judge
from torchfleet_compat.matrix import (
    FAIL,
    OK,
    WARN,
    arch_coverage,
    parse_version,
    python_in,
    torch_matches,
    version_at_least,
)
from torchfleet_compat.probe import Disk, Gpu, NodeFacts, format_cudnn

REPO = Path(__file__).resolve().parents[2]

# A small matrix of the same shape as compat/matrix.yml, so tests do not depend on its values.
NO_TOOLKIT = {
    "toolkit_version": None,
    "torchvision": None,
    "runfile": None,
    "toolkit_repos": [],
    "toolkit_package": None,
}
MATRIX_DATA = {
    "default_profile": "cu116",
    "min_free_disk_gb": 20,
    "min_free_disk_gb_without_gpu": 5,
    "profiles": {
        "cu116": {
            **NO_TOOLKIT,
            "cuda": "11.6",
            "min_driver": "510.47.03",
            "torch": "1.12.1+cu116",
            "wheel_index": "https://download.pytorch.org/whl/cu116",
            "pythons": ["3.8", "3.9", "3.10"],
            "compute_capabilities": ["7.0", "7.5", "8.0", "8.6"],
            "max_compute_capability": "8.7",
        },
        "cu121": {
            **NO_TOOLKIT,
            "cuda": "12.1",
            "min_driver": "530.30.02",
            "torch": "2.3.1+cu121",
            "wheel_index": "https://download.pytorch.org/whl/cu121",
            "pythons": ["3.8", "3.9", "3.10", "3.11"],
            "compute_capabilities": ["7.0", "7.5", "8.0", "8.6", "9.0"],
            "max_compute_capability": "9.0",
        },
        "cpu": {
            **NO_TOOLKIT,
            "cuda": None,
            "min_driver": None,
            "torch": "2.13.0",
            "wheel_index": None,
            "pythons": ["3.10", "3.11"],
            "compute_capabilities": [],
            "max_compute_capability": None,
        },
    },
    "gpus": {
        "A10G": {"compute_capability": "8.6", "arch": "ampere", "memory_gib": 24},
        "H100": {"compute_capability": "9.0", "arch": "hopper", "memory_gib": 80},
    },
    "distros": {
        "debian-11": {
            "python": "3.9",
            "cuda_repo": "debian11",
            "driver_source": "cuda_repo",
            "standard_support_until": "2099-12-31",  # past-support cases set Options.today
        },
        "debian-12": {
            "python": "3.11",
            "cuda_repo": "debian12",
            "driver_source": "distro",
            "standard_support_until": "2099-12-31",
        },
    },
}
MATRIX = compat.parse(MATRIX_DATA, "test-matrix.yml")

CU116_ARCHES = ["sm_37", "sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86"]


def gpu_facts(**changes) -> NodeFacts:
    """A healthy cu116 node with one A10G, as the probe would report it."""
    base = NodeFacts(
        python_version="3.9.2",
        torch_version="1.12.1+cu116",
        torch_cuda="11.6",
        cuda_available=True,
        arch_list=list(CU116_ARCHES),
        cudnn_version=8302,
        driver_version="535.104.05",
        driver_source="nvidia-smi",
        gpus=[Gpu(0, "NVIDIA A10G", "8.6")],
        distro="debian-11",
        disk=Disk("/", "/", 100 * 10**9),
        mem_total_bytes=32 << 30,
        mem_available_bytes=30 << 30,
    )
    return dataclasses.replace(base, **changes)


def by_name(checks):
    return {c.name: c for c in checks}


# --------------------------------------------------------------------------- pure logic


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("535.104.05", (535, 104, 5)),
        ("1.12.1+cu116", (1, 12, 1)),
        ("2.1.0a0+git1234", (2, 1, 0)),
        ("12.1", (12, 1)),
        (" 3.11.7 ", (3, 11, 7)),
    ],
)
def test_parse_version(text, parsed):
    assert parse_version(text) == parsed


def test_parse_version_rejects_garbage():
    with pytest.raises(ValueError, match="not a version"):
        parse_version("N/A")


@pytest.mark.parametrize(
    ("actual", "minimum", "expected"),
    [
        ("510.47.03", "510.47.03", True),
        ("535.54.03", "510.47.03", True),
        ("510.47.2", "510.47.03", False),  # numeric, not string, comparison of the patch
        ("470.82.01", "510.47.03", False),
        ("1.12", "1.12.0", True),  # missing parts count as zero
        ("10.1", "9.2", True),
    ],
)
def test_version_at_least(actual, minimum, expected):
    assert version_at_least(actual, minimum) is expected


@pytest.mark.parametrize(
    ("installed", "pinned", "expected"),
    [
        ("2.13.0+cpu", "2.13.0", True),  # an untagged pin accepts any build of that release
        ("2.13.0", "2.13.0", True),
        ("1.12.1+cu116", "1.12.1+cu116", True),
        ("1.12.1+cu113", "1.12.1+cu116", False),  # a tagged pin wants that build
        ("1.12.0+cu116", "1.12.1+cu116", False),
    ],
)
def test_torch_matches(installed, pinned, expected):
    assert torch_matches(installed, pinned) is expected


def test_python_in_compares_major_minor():
    assert python_in("3.10.12", ["3.9", "3.10"])
    assert not python_in("3.1.0", ["3.10"])  # "3.1" must not match "3.10" as a prefix would


@pytest.mark.parametrize(("raw", "text"), [(8302, "8.3.2"), (8902, "8.9.2"), (90100, "9.1.0")])
def test_format_cudnn(raw, text):
    assert format_cudnn(raw) == text


@pytest.mark.parametrize(
    ("cap", "arches", "status"),
    [
        ("9.0", ["sm_80", "sm_90"], OK),  # exact cubin
        ("8.6", ["sm_75", "compute_80"], OK),  # same-major PTX below the GPU: JIT
        ("8.6", ["sm_80"], WARN),  # lower cubin only: binary compatibility
        ("9.0", CU116_ARCHES, FAIL),  # Hopper on a CUDA 11.6 wheel
        ("8.0", ["compute_86"], FAIL),  # PTX above the GPU cannot run
        ("9.0", ["sm_90a"], OK),  # arch-specific cubin on its own capability
        ("9.1", ["sm_90a"], FAIL),  # ... but never forward
        ("7.5", ["sm_86", "sm_90"], FAIL),  # newer majors do not help an older GPU
    ],
)
def test_arch_coverage(cap, arches, status):
    got, reason = arch_coverage(cap, arches)
    assert got == status, reason


def test_min_driver_exact_and_lower_bound():
    assert compat.min_driver_for(MATRIX, "11.6") == ("510.47.03", True)
    # CUDA 12.4 is not in the matrix: 12.1's minimum is only a lower bound
    assert compat.min_driver_for(MATRIX, "12.4") == ("530.30.02", False)
    assert compat.min_driver_for(MATRIX, "10.2") == (None, False)


# --------------------------------------------------------------------------- evaluation


def test_healthy_gpu_node_passes_every_check():
    profile, checks = judge(gpu_facts(), MATRIX, Options())
    assert profile.name == "cu116"
    assert {c.name: c.status for c in checks if c.status != OK} == {}
    assert by_name(checks)["cudnn"].value == "8.3.2"


def test_distro_past_standard_support_warns_and_names_the_supported_ones():
    data = copy.deepcopy(MATRIX_DATA)
    data["distros"]["debian-11"]["standard_support_until"] = "2026-08-31"
    data["distros"]["debian-12"]["standard_support_until"] = "2028-06-30"
    matrix = compat.parse(data, "test-matrix.yml")
    on_the_day = by_name(judge(gpu_facts(), matrix, Options(today="2026-08-31"))[1])["distro"]
    assert on_the_day.status == OK
    past = by_name(judge(gpu_facts(), matrix, Options(today="2026-09-01"))[1])["distro"]
    assert past.status == "warn"
    assert past.hint == (
        "debian-11's standard support ended on 2026-08-31 (no free security updates since): "
        "use distro debian-12"
    )
    # before the install too: a warning, never a refusal, even where the distro rule fails
    bare = Options(today="2026-09-01", installed=False)
    assert by_name(judge(gpu_facts(), matrix, bare)[1])["distro"].status == "warn"


def test_driver_too_old_fails_with_hint_naming_min_driver():
    _, checks = judge(gpu_facts(driver_version="470.82.01"), MATRIX, Options())
    driver = by_name(checks)["nvidia driver"]
    assert driver.status == FAIL
    assert "510.47.03" in driver.hint and "510.47.03" in driver.expected


def test_driver_for_cuda_missing_from_matrix_is_a_warning_unless_certainly_too_old():
    newer = dict(torch_version="2.5.1+cu124", torch_cuda="12.4", arch_list=["sm_80", "sm_90"])
    _, checks = judge(gpu_facts(**newer), MATRIX, Options())
    assert by_name(checks)["nvidia driver"].status == WARN
    _, checks = judge(gpu_facts(driver_version="520.61.05", **newer), MATRIX, Options())
    assert by_name(checks)["nvidia driver"].status == FAIL  # below cu121's 530.30.02


def test_gpu_arch_not_covered_by_wheel_fails_and_names_a_profile_that_fits():
    facts = gpu_facts(gpus=[Gpu(0, "NVIDIA H100 80GB HBM3", "9.0")])
    _, checks = judge(facts, MATRIX, Options())
    arch = by_name(checks)["gpu arch (NVIDIA H100 80GB HBM3)"]
    assert arch.status == FAIL
    assert "cu121" in arch.hint


def test_capability_above_profile_ceiling_fails_even_when_binary_compatible():
    # an L4 (8.9) on cu116: sm_86 runs by binary compatibility, but the matrix caps cu116 at 8.7
    facts = gpu_facts(gpus=[Gpu(0, "NVIDIA L4", "8.9")])
    _, checks = judge(facts, MATRIX, Options())
    assert by_name(checks)["gpu arch (NVIDIA L4)"].status == FAIL


def test_unknown_capability_is_taken_from_the_matrix_gpu_table():
    facts = gpu_facts(gpus=[Gpu(0, "NVIDIA A10G", None)], arch_list=[])
    _, checks = judge(facts, MATRIX, Options(profile="cu116"))
    arch = by_name(checks)["gpu arch (NVIDIA A10G)"]
    assert arch.status == OK and "sm_86" in arch.value


def test_cpu_torch_on_a_gpu_node_fails_torch_cuda():
    facts = gpu_facts(torch_version="2.13.0+cpu", torch_cuda=None, arch_list=[], cudnn_version=None)
    _, checks = judge(facts, MATRIX, Options(profile="cu116"))
    assert by_name(checks)["torch CUDA"].status == FAIL
    assert by_name(checks)["cudnn"].status == SKIP


def test_cpu_only_host_skips_gpu_checks_and_require_gpu_fails_them():
    facts = NodeFacts(
        python_version="3.11.7",
        torch_version="2.13.0+cpu",
        disk=Disk("/", "/", 100 * 10**9),
        mem_total_bytes=8 << 30,
        mem_available_bytes=6 << 30,
    )
    profile, checks = judge(facts, MATRIX, Options())
    assert profile.name == "cpu"
    statuses = {c.name: c.status for c in checks}
    assert statuses["nvidia driver"] == statuses["gpu"] == statuses["cudnn"] == SKIP
    assert FAIL not in statuses.values()
    _, checks = judge(facts, MATRIX, Options(require_gpu=True))
    assert by_name(checks)["gpu"].status == FAIL


def test_profile_choice_and_unknown_profile():
    assert judge(gpu_facts(), MATRIX, Options(profile="cu121"))[0].name == "cu121"
    with pytest.raises(compat.MatrixError, match=r"--profile = 'cu999'.*cu116, cu121, cpu"):
        judge(gpu_facts(), MATRIX, Options(profile="cu999"))


def test_python_and_torch_outside_profile_warn():
    facts = gpu_facts(python_version="3.11.4", torch_version="1.13.1+cu116")
    _, checks = judge(facts, MATRIX, Options(profile="cu116"))
    assert by_name(checks)["python"].status == WARN
    assert by_name(checks)["torch"].status == WARN
    _, checks = judge(gpu_facts(torch_version="1.11.0+cu115"), MATRIX, Options())
    assert by_name(checks)["torch"].status == FAIL  # below what the runtime supports


def test_real_statvfs_against_thresholds(tmp_path):
    facts = probe.probe(str(tmp_path / "models" / "not-yet"), MATRIX.gpus, installed=True)
    assert facts.disk.checked_path == str(tmp_path)  # the nearest existing ancestor
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    _, checks = judge(facts, MATRIX, Options(min_free_disk_gb=free_gb / 1000))
    assert by_name(checks)["disk"].status == OK
    _, checks = judge(facts, MATRIX, Options(min_free_disk_gb=free_gb * 1000 + 1))
    disk = by_name(checks)["disk"]
    assert disk.status == FAIL and "GB" in disk.hint


def test_read_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\nMemFree: 1 kB\nMemAvailable:    8192 kB\n")
    assert probe.read_meminfo(str(meminfo)) == (16384 * 1024, 8192 * 1024)
    assert probe.read_meminfo(str(tmp_path / "missing")) == (None, None)


def test_procfs_driver_version(tmp_path):
    version = tmp_path / "driver/nvidia/version"
    version.parent.mkdir(parents=True)
    version.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    assert probe.procfs_driver(str(tmp_path)) == "535.104.05"
    assert probe.procfs_driver(str(tmp_path / "none")) is None


def test_render_table_lists_hints_of_failures():
    _, checks = judge(gpu_facts(driver_version="470.82.01"), MATRIX, Options())
    table = check_cli.render_table(checks)
    assert table.splitlines()[0].split() == ["CHECK", "STATUS", "VALUE", "EXPECTED"]
    assert "FAIL: nvidia driver:" in table


# --------------------------------------------------------------------------- matrix lookup


def test_matrix_lookup_order(tmp_path, monkeypatch):
    explicit, from_env = tmp_path / "a.yml", tmp_path / "b.yml"
    explicit.write_text("x: 1")
    from_env.write_text("x: 1")
    env = {"TORCHFLEET_MATRIX": str(from_env)}
    assert check_cli.find_matrix(str(explicit), env) == explicit
    assert check_cli.find_matrix(None, env) == from_env
    with pytest.raises(CheckError, match="TORCHFLEET_MATRIX .*no such file"):
        check_cli.find_matrix(None, {"TORCHFLEET_MATRIX": str(tmp_path / "nope.yml")})
    # nothing given: /etc/torchfleet (absent here) then the checkout's compat/matrix.yml
    monkeypatch.setattr(check_cli, "ETC_MATRIX", str(tmp_path / "etc-matrix.yml"))
    assert check_cli.find_matrix(None, {}) == REPO / "compat" / "matrix.yml"


def test_load_matrix_rejects_a_file_without_profiles(tmp_path):
    bad = tmp_path / "m.yml"
    bad.write_text("default_profile: cu116\n")
    with pytest.raises(CheckError, match="profiles"):
        check_cli.load_matrix(bad)


# --------------------------------------------------------------------------- the real CLI


def run_cli(*args, env=None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "torchfleet_runtime.cli", "check", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


@pytest.fixture
def matrix_file(tmp_path):
    path = tmp_path / "matrix.yml"
    path.write_text(yaml.safe_dump(MATRIX_DATA))
    return path


def test_cli_json_on_this_machine(matrix_file, tmp_path):
    proc = run_cli("--json", "--matrix", str(matrix_file), "--path", str(tmp_path))
    report = json.loads(proc.stdout)
    assert set(report) == {"matrix", "profile", "ok", "summary", "checks"}
    assert report["matrix"] == str(matrix_file)
    for check in report["checks"]:
        assert set(check) == {"name", "status", "value", "expected", "hint"}
        assert check["status"] in (OK, WARN, FAIL, SKIP)
    checks = {c["name"]: c for c in report["checks"]}
    for name in (
        "python",
        "torch",
        "torch CUDA",
        "nvidia driver",
        "gpu",
        "cudnn",
        "disk",
        "memory",
    ):
        assert name in checks
    major_minor = "{}.{}".format(*sys.version_info[:2])
    assert checks["python"]["value"].startswith(major_minor)
    import torch

    assert checks["torch"]["value"] == torch.__version__
    assert sum(report["summary"].values()) == len(report["checks"])
    assert proc.returncode == (0 if report["ok"] else 1), proc.stderr
    if not torch.cuda.is_available() and not shutil.which("nvidia-smi"):
        assert checks["gpu"]["status"] == SKIP


def test_cli_exit_status_follows_failures(matrix_file, tmp_path):
    ok = run_cli("--matrix", str(matrix_file), "--path", str(tmp_path), "--min-free-disk-gb", "0")
    failed = run_cli(
        "--matrix", str(matrix_file), "--path", str(tmp_path), "--min-free-disk-gb", "1e12"
    )
    assert "FAIL: disk:" in failed.stdout
    assert failed.returncode == 1
    assert "FAIL: disk:" not in ok.stdout
    assert ok.returncode == (1 if "FAIL:" in ok.stdout else 0)


def test_cli_usage_errors_exit_2_with_a_message(tmp_path):
    proc = run_cli("--matrix", str(tmp_path / "missing.yml"))
    assert proc.returncode == 2
    assert "missing.yml: no such file" in proc.stderr
    proc = run_cli("--profile", "cu999")
    assert proc.returncode == 2 and "'cu999'" in proc.stderr


def test_a_gpu_on_the_bus_that_no_driver_lists_fails():
    """The one probe sees the PCI bus on an installed node too: a GPU there without a driver
    fails `check` instead of skipping the GPU rows."""
    facts = NodeFacts(
        python_version="3.11.7",
        torch_version="2.13.0",
        pci=[Gpu(0, "GA102GL [A10G]", None, "A10G", "lspci", device_id="0x2237")],
        disk=Disk("/", "/", 100 * 10**9),
        mem_total_bytes=8 << 30,
        mem_available_bytes=6 << 30,
    )
    _, checks = judge(facts, MATRIX, Options(profile="cu121"))
    statuses = by_name(checks)
    assert statuses["nvidia driver"].status == FAIL
    assert statuses["nvidia driver"].value == "not found"
    assert statuses["gpu"].status == FAIL
    assert statuses["gpu"].value == "no driver lists the GPU(s) on the PCI bus"
    assert statuses["gpu arch (GA102GL [A10G])"].status == OK  # the matrix judges the bus's GPU
    assert statuses["torch CUDA"].status == FAIL  # a CPU torch on a GPU node
