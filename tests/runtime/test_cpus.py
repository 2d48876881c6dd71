"""`torch_threads: auto` under a CPU quota: fake /proc/self/{cgroup,mountinfo} and cgroup trees
laid out as the kernel does for cgroup v2, v1 and hybrid hosts, with and without a namespace."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from torchfleet_runtime import service
from torchfleet_runtime.config import Config
from torchfleet_runtime.cpus import cgroup_cpu_limit, usable_cpus

V2_MOUNT = "30 25 0:26 {root} {point} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNT = "32 31 0:29 {root} {point} rw,nosuid,relatime shared:9 - cgroup cgroup rw,{opts}\n"
OTHER = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"


def fake_proc(tmp: Path, cgroup: str, mountinfo: str) -> str:
    proc = tmp / "proc-self"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(OTHER + mountinfo)
    return str(proc)


def write(directory: Path, **files: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text + "\n")


def test_v2_quota_in_a_cgroup_namespace(tmp_path):
    cg = tmp_path / "cg"
    write(cg, cpu_max="150000 100000")  # podman run --cpus 1.5: the container's own root
    proc = fake_proc(tmp_path, "0::/\n", V2_MOUNT.format(root="/", point=cg))
    assert cgroup_cpu_limit(proc) == pytest.approx(1.5)
    assert usable_cpus(proc, affinity=16) == 1  # floor: a second thread would only be throttled
    write(cg, cpu_max="max 100000")
    assert cgroup_cpu_limit(proc) is None and usable_cpus(proc, affinity=16) == 16


def test_v2_a_parent_slice_quota_limits_the_child(tmp_path):
    cg = tmp_path / "cg"
    pod, ctr = cg / "kubepods.slice" / "pod1", cg / "kubepods.slice" / "pod1" / "ctr"
    write(pod, cpu_max="300000 100000")
    write(ctr, cpu_max="max 100000")
    write(cg / "kubepods.slice", cpu_max="800000 100000")
    proc = fake_proc(tmp_path, "0::/kubepods.slice/pod1/ctr\n", V2_MOUNT.format(root="/", point=cg))
    assert cgroup_cpu_limit(proc) == pytest.approx(3.0)
    assert usable_cpus(proc, affinity=64) == 3
    assert usable_cpus(proc, affinity=2) == 2  # the affinity mask is tighter: it wins


def test_v2_without_a_namespace_reads_the_mount_the_container_sees(tmp_path):
    cg = tmp_path / "cg"
    write(cg, cpu_max="200000 100000")  # the host path below does not exist in the container
    proc = fake_proc(
        tmp_path, "0::/machine.slice/libpod-abc.scope\n", V2_MOUNT.format(root="/", point=cg)
    )
    assert usable_cpus(proc, affinity=8) == 2


def test_v1_cfs_quota_with_a_mount_showing_a_sub_tree(tmp_path):
    cpu = tmp_path / "cpu,cpuacct"
    write(cpu, cpu_cfs_quota_us="250000", cpu_cfs_period_us="100000")
    # docker on cgroup v1: the mount's root is the container's own cgroup
    proc = fake_proc(
        tmp_path,
        "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n",
        V1_MOUNT.format(root="/docker/abc", point=cpu, opts="cpu,cpuacct"),
    )
    assert cgroup_cpu_limit(proc) == pytest.approx(2.5)
    assert usable_cpus(proc, affinity=8) == 2
    write(cpu, cpu_cfs_quota_us="-1")  # no quota
    assert cgroup_cpu_limit(proc) is None and usable_cpus(proc, affinity=8) == 8


def test_hybrid_host_counts_the_v1_cpu_controller(tmp_path):
    cpu, unified = tmp_path / "cpu", tmp_path / "unified"
    write(
        cpu / "system.slice" / "torchfleet-runtime.service",
        cpu_cfs_quota_us="100000",
        cpu_cfs_period_us="100000",
    )
    write(cpu, cpu_cfs_quota_us="-1", cpu_cfs_period_us="100000")
    unified.mkdir()  # no cpu controller in the unified hierarchy: no cpu.max there
    mounts = (
        V1_MOUNT.format(root="/", point=cpu, opts="cpu")
        + V1_MOUNT.format(root="/", point=tmp_path / "mem", opts="memory")
        + V2_MOUNT.format(root="/", point=unified)
    )
    proc = fake_proc(
        tmp_path,
        "4:memory:/system.slice/torchfleet-runtime.service\n"
        "1:cpu:/system.slice/torchfleet-runtime.service\n"
        "0::/system.slice/torchfleet-runtime.service\n",
        mounts,
    )
    assert cgroup_cpu_limit(proc) == pytest.approx(1.0)
    assert usable_cpus(proc, affinity=4) == 1


def test_a_tiny_quota_still_gives_one_thread_and_garbage_means_no_limit(tmp_path):
    cg = tmp_path / "cg"
    write(cg, cpu_max="10000 100000")  # 0.1 CPU
    proc = fake_proc(tmp_path, "0::/\n", V2_MOUNT.format(root="/", point=cg))
    assert usable_cpus(proc, affinity=4) == 1
    write(cg, cpu_max="lots 100000")
    assert cgroup_cpu_limit(proc) is None
    assert usable_cpus(str(tmp_path / "no-such-proc"), affinity=4) == 4


def test_this_host_is_readable():
    limit = cgroup_cpu_limit()
    assert limit is None or limit > 0
    affinity = len(os.sched_getaffinity(0))
    expected = affinity if limit is None else max(1, min(affinity, math.floor(limit)))
    assert usable_cpus() == expected


def test_torch_threads_auto_uses_the_quota(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(service, "usable_cpus", lambda: 1)
    try:
        assert service.configure_threads(Config(model="x"))[0] == 1
        assert torch.get_num_threads() == 1
        assert (
            service.configure_threads(Config(model="x", torch_threads=2))[0] == 2
        )  # an explicit value wins
    finally:
        torch.set_num_threads(before)
