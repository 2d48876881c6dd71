"""The preflight role's module, run for real on fake trees.

The module (roles/preflight/library/torchfleet_probe.py) ships to nodes with torchfleet_compat
as its module_utils; these tests run it through `ansible -m torchfleet_probe` with the role's
library and compat/src as the module_utils path, the way the role ships it to a node, against a
fake sysfs/dev/proc/apt tree and a fake nvidia-smi/lspci: the GPU states a CI box without a GPU
cannot show.
"""

from __future__ import annotations

import configparser
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles/preflight"
MATRIX = yaml.safe_load((ROOT / "compat/matrix.yml").read_text())
KERNEL = "6.1.0-18-cloud-amd64"


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


def run_probe(root: Path, bindir: Path | None = None, **params) -> dict:
    """The module's result for a node that is the fake tree under `root`."""
    args = {
        "matrix": MATRIX,
        "min_free_disk_gb": 0,  # this box's free disk is not the subject (the rule is tested in runtime)
        "install_root": str(root / "opt/x"),
        "roots": {
            "sysfs": str(root / "sys"),
            "dev": str(root / "dev"),
            "proc": str(root / "proc"),
            "modules": str(root / "lib/modules"),
            "apt": str(root / "etc/apt"),
            "apt_lists": str(root / "var/lib/apt/lists"),
            "os_release": str(root / "etc/os-release"),
            "meminfo": str(root / "proc/meminfo"),
            "kernel": KERNEL,
        },
        **params,
    }
    os_release = root / "etc/os-release"
    if not os_release.exists():
        os_release.parent.mkdir(parents=True, exist_ok=True)
        os_release.write_text('ID=debian\nVERSION_ID="12"\n')
    path = f"{bindir}:" if bindir else ""
    env = {
        "PATH": f"{path}{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(root),
        "ANSIBLE_LIBRARY": str(ROLE / "library"),
        "ANSIBLE_MODULE_UTILS": str(ROOT / "compat/src"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCAL_TEMP": str(root / ".ansible-tmp"),
    }
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible"),
            "localhost",
            "-c",
            "local",
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-m",
            "torchfleet_probe",
            "-a",
            json.dumps(args),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=root,
    )
    try:
        result = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    except (ValueError, KeyError, IndexError):
        raise AssertionError(
            f"ansible failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        ) from None
    return result


def test_probe_without_gpu_reports_none_and_reads_mirror(tmp_path: Path) -> None:
    # An Intel VGA device and NVIDIA's HDMI audio function are not NVIDIA GPUs.
    fake_pci(tmp_path, "0000:00:02.0", "0x8086", "0x030000", "0x1234")
    fake_pci(tmp_path, "0000:00:1f.1", "0x10de", "0x040300", "0x22ba")
    (tmp_path / "opt").mkdir()
    (tmp_path / "etc/apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "etc/apt/sources.list.d/debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main\n"
    )
    result = run_probe(tmp_path, profile="cpu")
    report = result["probe"]
    assert result["changed"] is False and result["problems"] == [] and result["refusal"] == ""
    assert result["refused"] is False
    assert report["pci"] == [] and report["device_files"] == []
    assert report["kernel"]["headers_present"] is False
    # /opt/x does not exist: free disk is measured on its nearest existing parent.
    assert report["disk"]["checked_path"] == str(tmp_path / "opt")
    assert report["disk"]["free_bytes"] > 0
    facts = result["ansible_facts"]
    # the contract facts later roles read (nvidia_driver takes the mirror from here)
    assert facts["torchfleet_apt_mirror"] == "http://mirror.example/debian"
    assert facts["torchfleet_distro"] == "debian-12"
    assert facts["torchfleet_cuda_repo"] == "debian12"
    assert facts["torchfleet_python_version"] == "{}.{}".format(*sys.version_info[:2])
    assert facts["torchfleet_gpu_present"] is False
    assert facts["torchfleet_profile"] == {k: v for k, v in MATRIX["profiles"]["cpu"].items()}
    assert result["packages"] == {
        "needed": False,
        "pciutils": False,
        "refresh_lists": False,
        "cache_valid_time": 0,
    }


def test_probe_names_gpu_with_lspci_and_refuses_a_profile_that_cannot_drive_it(
    tmp_path: Path,
) -> None:
    fake_pci(tmp_path, "0000:00:1e.0", "0x10de", "0x030200", "0x2330")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidia0").write_text("")
    (tmp_path / "dev/nvidiactl").write_text("")
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build\n"
    )
    (tmp_path / "lib/modules" / KERNEL / "build").mkdir(parents=True)
    bindir = tmp_path / "bin"
    fake_bin(
        bindir,
        "lspci",
        'echo \'00:1e.0 "3D controller" "NVIDIA Corporation" '
        '"GH100 [H100 SXM5 80GB HBM3]" -ra1 "NVIDIA Corporation" "Device 16c1"\'\n',
    )
    # this interpreter's Python is not the subject here
    result = run_probe(tmp_path, bindir, profile="cu116", check_python=False)
    report = result["probe"]
    assert report["device_files"] == ["/dev/nvidia0"]
    assert (report["driver_version"], report["driver_source"]) == ("535.104.05", "procfs")
    assert [(g["device_id"], g["name"], g["model"], g["via"]) for g in report["pci"]] == [
        ("0x2330", "GH100 [H100 SXM5 80GB HBM3]", "H100", "lspci")
    ]
    assert report["kernel"]["headers_present"] is True
    facts = result["ansible_facts"]
    assert facts["torchfleet_gpu_present"] is True and facts["torchfleet_gpu_count"] == 1
    assert facts["torchfleet_gpu_model"] == "H100"
    assert facts["torchfleet_compute_capability"] == "9.0"
    assert facts["torchfleet_nvidia_driver_loaded"] == "535.104.05"
    assert result["rules"]["gpu"] is False
    assert result["problems"] == [
        "cu116 cannot drive H100 (compute 9.0 > 8.7): set torchfleet_cuda_profile to cu118 or cu121"
    ]
    # the fail task's sentence, ready-made
    assert result["refused"] is True
    assert result["refusal"] == "(1) " + result["problems"][0] + "."
    # the same node under a profile that drives Hopper passes
    assert run_probe(tmp_path, bindir, profile="cu121", check_python=False)["problems"] == []


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
    result = run_probe(
        tmp_path,
        bindir,
        profile="cu116",
        gpu_model="T4",
        check_kernel_headers=False,
        check_python=False,
    )
    (smi,) = result["probe"]["gpus"]
    assert (smi["model"], smi["via"]) == ("A100-80G", "nvidia-smi")
    assert smi["compute_capability"] is None
    assert smi["driver_version"] == "470.82.01"
    assert result["ansible_facts"]["torchfleet_nvidia_driver_loaded"] == "470.82.01"
    # no lspci on this node: the role is asked to install pciutils
    assert result["packages"]["pciutils"] is True and result["packages"]["needed"] is True
    assert result["problems"] == [
        "the inventory declares torchfleet_gpu_model=T4 but this node has A100-80G (nvidia-smi): "
        "fix the inventory (or infra's instance type), or set preflight_check_gpu_model_match=false"
    ]


def test_a_converged_node_counts_its_own_install_as_room(tmp_path: Path) -> None:
    # A re-run on a node that already holds torchfleet's tree: what that tree occupies counts,
    # so a node with its install in place is not refused for the space the install took.
    tree = tmp_path / "opt/torchfleet/venv"
    tree.mkdir(parents=True)
    with open(tree / "torch.so", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 1 << 30)  # 1 GiB allocated, instantly
    (tmp_path / "elsewhere").mkdir()
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    # a floor between free and free + the tree (0.5 GB of margin either side)
    floor_gb = (free + (1 << 29)) / 1e9
    common = {"profile": "cpu", "install_root": str(tmp_path / "opt"), "min_free_disk_gb": floor_gb}
    counted = run_probe(tmp_path, reused_paths=[str(tmp_path / "opt/torchfleet")], **common)
    assert counted["problems"] == []
    assert counted["probe"]["disk"]["reused_bytes"] >= 1 << 30
    # the same node without the credit (a tree that is not the install) is refused, by name
    refused = run_probe(tmp_path, reused_paths=[str(tmp_path / "elsewhere")], **common)
    assert refused["probe"]["disk"]["reused_bytes"] == 0
    (problem,) = refused["problems"]
    assert problem.startswith("only ") and f"needs {floor_gb:g} GB" in problem
    assert "lower preflight_min_free_disk_gb" in problem


def test_the_disk_floor_of_a_node_without_a_gpu_is_the_wheels_and_model(tmp_path: Path) -> None:
    # no GPU: the driver and toolkit are skipped, so the matrix's smaller floor applies; a
    # forced driver/toolkit (an image bake on a CPU builder) brings back the GPU node's floor
    bare = run_probe(tmp_path, profile="cpu", min_free_disk_gb=None)
    assert bare["min_free_disk_gb"] == MATRIX["min_free_disk_gb_without_gpu"] == 5
    for force in ("nvidia_driver_force", "cuda_force"):
        forced = run_probe(tmp_path, profile="cpu", min_free_disk_gb=None, **{force: True})
        assert forced["min_free_disk_gb"] == MATRIX["min_free_disk_gb"] == 20, force


def test_probe_reports_every_bad_input_at_once(tmp_path: Path) -> None:
    result = run_probe(
        tmp_path,
        profile="cu999",
        gpu_model="K80",
        compute_capability="eight",
        min_free_disk_gb=-1,
        install_root="opt",
        roots={"sysfs": str(tmp_path), "bogus": "/x"},
    )
    assert result["failed"] is True
    msg = result["msg"]
    for part in (
        "(1) torchfleet_cuda_profile = 'cu999' is invalid; allowed: a profile of "
        "compat/matrix.yml: cu116, cu118, cu121, cpu.",
        "(2) torchfleet_gpu_model = 'K80' is invalid; allowed: a GPU of the matrix gpus: V100,",
        "(3) torchfleet_compute_capability = 'eight' is invalid; allowed: MAJOR.MINOR in quotes",
        "(4) preflight_min_free_disk_gb = -1.0 is invalid; allowed: a number of GB >= 0",
        "(5) preflight_install_root = 'opt' is invalid; allowed: an absolute path.",
        "(6) roots.bogus = '/x' is invalid; allowed: the keys sysfs, dev,",
    ):
        assert part in msg


def test_probe_refuses_a_matrix_that_breaks_the_schema(tmp_path: Path) -> None:
    broken = json.loads(json.dumps(MATRIX))
    broken["profiles"]["cu116"]["pythons"] = [3.1]  # YAML's reading of an unquoted 3.10
    del broken["gpus"]["T4"]["arch"]
    result = run_probe(tmp_path, matrix=broken)
    assert result["failed"] is True
    assert "profiles.cu116.pythons[0] = 3.1 is invalid" in result["msg"]
    assert "in quotes" in result["msg"]
    assert "gpus.T4.arch = '(missing)'" in result["msg"]


def test_the_role_ships_the_compat_package_itself_not_a_link_or_a_copy() -> None:
    # One source: no module_utils of the role's own; Ansible finds the package on the
    # module_utils path that ansible.cfg (and every run without it) names.
    assert not (ROLE / "module_utils").exists()
    assert not [p for p in ROLE.rglob("*") if p.is_symlink()]
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert (ROOT / cfg["defaults"]["module_utils"]).resolve() == (ROOT / "compat/src").resolve()
    for scenario in ("site", "legacy"):
        molecule = yaml.safe_load(
            (ROOT / f"tests/roles/molecule/{scenario}/molecule.yml").read_text()
        )
        assert molecule["provisioner"]["env"]["ANSIBLE_MODULE_UTILS"].endswith("/compat/src")
