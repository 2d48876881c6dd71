"""The matrix module itself: its schema, GPU names, distro names, and that the package needs
nothing but the standard library (it runs on a bare Python 3.8 node as Ansible module_utils)."""

from __future__ import annotations

import ast
import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from torchfleet_compat import matrix as compat

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "compat/src/torchfleet_compat"
RAW = yaml.safe_load((ROOT / "compat/matrix.yml").read_text())


def problems(data) -> list[str]:
    with pytest.raises(compat.MatrixError) as err:
        compat.parse(data, "m.yml")
    return err.value.problems


def test_the_repository_matrix_parses():
    m = compat.read(str(ROOT / "compat/matrix.yml"))
    assert m.default_profile in m.profiles
    assert m.profiles["cu116"].capability_range == ("3.7", "8.7")
    assert m.profiles["cpu"].capability_range is None
    assert m.profiles["cu116"].as_dict() == RAW["profiles"]["cu116"]


def test_every_schema_problem_is_reported_at_once_with_file_key_value_and_allowed():
    data = copy.deepcopy(RAW)
    data["profiles"]["cu116"]["pythons"] = ["3.8", 3.1]  # YAML's reading of an unquoted 3.10
    data["profiles"]["cu118"]["max_compute_capability"] = "8.6"  # below its own arch list
    data["profiles"]["cpu"]["min_driver"] = "510.47.03"  # a driver for a CPU profile
    data["gpus"]["T4"]["arch"] = "kepler"
    del data["gpus"]["L4"]["memory_gib"]
    data["distros"]["debian-12"]["driver_source"] = "vendor"
    data["distros"]["centos-7"] = dict(data["distros"]["debian-12"], driver_source="distro")
    data["default_profile"] = "cu999"
    data["extra"] = 1
    got = problems(data)
    want = [
        "m.yml: profiles.cu116.pythons[1] = 3.1 is invalid; allowed: Python versions such as "
        '"3.10" in quotes (YAML reads 3.10 as the number 3.1)',
        "m.yml: profiles.cu118.max_compute_capability = '8.6' is invalid; allowed: at least the "
        "highest of compute_capabilities (9.0)",
        "m.yml: profiles.cpu.min_driver = '510.47.03' is invalid; allowed: set when cuda is set, "
        "empty/null when it is not (cuda = None)",
        "m.yml: gpus.T4.arch = 'kepler' is invalid; allowed: volta | turing | ampere | ada | "
        "hopper | blackwell",
        "m.yml: gpus.L4.memory_gib = '(missing)' is invalid; allowed: a value: each entry has the "
        "keys compute_capability, arch, memory_gib",
        "m.yml: distros.debian-12.driver_source = 'vendor' is invalid; allowed: distro | cuda_repo",
        "m.yml: distros = 'centos-7' is invalid; allowed: names such as debian-12 or ubuntu-22.04 "
        "(see distro_name)",
        "m.yml: default_profile = 'cu999' is invalid; allowed: a key of profiles: cu116, cu118, "
        "cu121, cpu",
    ]
    for line in want:
        assert line in got
    assert any(p.startswith("m.yml: extra = 1 is invalid; allowed: the keys ") for p in got)
    assert len(got) == len(want) + 1


def test_a_gpu_whose_memory_is_not_a_number_is_reported_not_a_crash():
    data = copy.deepcopy(RAW)
    data["gpus"]["T4"]["memory_gib"] = "sixteen"  # int("sixteen") crashed the parse before
    assert problems(data) == [
        "m.yml: gpus.T4.memory_gib = 'sixteen' is invalid; allowed: a whole number of GiB > 0"
    ]


def test_a_file_that_is_not_a_matrix_names_the_file(tmp_path):
    bad = tmp_path / "m.yml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(
        compat.MatrixError,
        match=r"m.yml: \(the file\) = .* is invalid; allowed: "
        r"a mapping with the keys default_profile",
    ):
        compat.read(str(bad))
    with pytest.raises(compat.MatrixError, match="cannot read the version matrix"):
        compat.read(str(tmp_path / "missing.yml"))


def test_a_profile_name_outside_the_matrix_names_the_setting_and_the_choices():
    m = compat.parse(RAW)
    with pytest.raises(
        compat.MatrixError,
        match=r"^--profile = 'cu999' is invalid; allowed: a profile of "
        r"compat/matrix.yml: cu116, cu118, cu121, cpu$",
    ):
        m.profile("cu999", "--profile")
    assert m.profile("").name == m.default_profile


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA A10G", "A10G"),
        ("GA102GL [A10]", "A10"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("TU104GL [Tesla T4]", "T4"),
        ("GA100 [A100 SXM4 40GB]", "A100"),
        ("NVIDIA A100-SXM4-80GB", "A100-80G"),  # a \b match would say A100
        ("NVIDIA H200", "H200"),
        ("Device 2330", None),
        ("", None),
    ],
)
def test_gpu_names_match_whole_tokens_and_the_longest_key_wins(name, model):
    assert compat.match_gpu(name, RAW["gpus"]) == model


def test_resolve_gpu_prefers_what_the_driver_reports():
    m = compat.parse(RAW)
    assert compat.resolve_gpu(m, name="NVIDIA L4").compute_capability == "8.9"
    assert compat.resolve_gpu(m, name="NVIDIA L4", reported_cc="9.0").compute_capability == "9.0"
    assert compat.resolve_gpu(m, declared_model="T4").compute_capability == "7.5"
    unknown = compat.resolve_gpu(m, name="Device 2330", declared_cc="8.6")
    assert (unknown.model, unknown.compute_capability) == ("", "8.6")


@pytest.mark.parametrize(
    ("os_id", "version", "name"),
    [
        ("debian", "12", "debian-12"),
        ("debian", "11.9", "debian-11"),
        ("ubuntu", "22.04", "ubuntu-22.04"),
        ("Ubuntu", "20.04", "ubuntu-20.04"),
        ("arch", "", "arch"),
    ],
)
def test_distro_names(os_id, version, name):
    assert compat.distro_name(os_id, version) == name


def test_read_os_release(tmp_path):
    path = tmp_path / "os-release"
    path.write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n')
    assert compat.read_os_release(str(path)) == "debian-12"
    assert compat.read_os_release(str(tmp_path / "none")) == ""


def test_python_versions_compare_as_numbers():
    assert compat.python_in("3.10.4", ["3.10"]) and not compat.python_in("3.1", ["3.10"])
    assert compat.minor("3.11.7") == "3.11"


def test_the_package_needs_only_the_standard_library_and_imports_its_siblings_relatively():
    for module in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(module.read_text())
        absolute = {
            (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            and not (isinstance(node, ast.ImportFrom) and node.level)
            for alias in node.names
        }
        # yaml only inside matrix.read(), for a .yml path (the probe is handed the parsed
        # matrix); torch and pynvml only inside the probe of an installed node
        lazy = {"matrix.py": {"yaml"}, "probe.py": {"torch", "pynvml"}}.get(module.name, set())
        assert absolute - set(sys.stdlib_module_names) == lazy, module.name
        # siblings relatively: Ansible ships the package as ansible.module_utils.torchfleet_compat
        assert "torchfleet_compat" not in absolute, module.name
    # and it imports with nothing else on the path (isolated mode, no site-packages)
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); "
            "from torchfleet_compat import check, judge, preflight, runtime_settings; "
            "from torchfleet_compat.matrix import match_gpu; print(match_gpu('NVIDIA L4', ['L4']))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "L4"


def test_disk_room_counts_what_an_earlier_install_occupies(tmp_path):
    matrix = compat.parse(RAW, "compat/matrix.yml")
    gb = 10**9
    short = compat.disk_verdict(matrix, 19 * gb)  # the matrix's 20 GB floor for a GPU node
    assert not short.ok
    assert short.reason == (
        "only 19.0 GB free but a node needs 20 GB for driver, toolkit, wheels and model"
    )
    # the same node with 4 GB of its own install in place fits (a re-run replaces it)
    again = compat.disk_verdict(matrix, 19 * gb, None, 4 * gb)
    assert again.ok and again.reason == (
        "19.0 GB free + 4.0 GB torchfleet already occupies (>= 20 GB)"
    )
    assert not compat.disk_verdict(matrix, 15 * gb, None, 4 * gb).ok
    assert compat.disk_verdict(matrix, 0, 0).ok  # 0 disables the check
    # a node that gets no driver or toolkit needs only the wheels' and model's floor
    assert compat.disk_verdict(matrix, 6 * gb, gpu_stack=False).ok
    bare = compat.disk_verdict(matrix, 4 * gb, gpu_stack=False)
    assert bare.reason == (
        "only 4.0 GB free but a node needs 5 GB for wheels and model (no GPU stack)"
    )
    assert compat.min_free_disk(matrix, 7, gpu_stack=False) == 7  # an override is the floor
    # tree_bytes: allocated bytes of the files under a tree, 0 for a missing one
    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "a/b/f").write_bytes(b"x" * 100_000)
    (tmp_path / "a/link").symlink_to("/usr")  # not followed
    assert 100_000 <= compat.tree_bytes(str(tmp_path / "a")) < 200_000
    assert compat.tree_bytes(str(tmp_path / "missing")) == 0


def test_the_floor_without_a_gpu_is_a_number_no_larger_than_the_gpu_floor():
    for bad in (30, -1, "5", True):
        data = copy.deepcopy(RAW)
        data["min_free_disk_gb_without_gpu"] = bad
        assert problems(data) == [
            f"m.yml: min_free_disk_gb_without_gpu = {bad!r} is invalid; allowed: a number of GB "
            ">= 0 and <= min_free_disk_gb (20)"
        ]
